"""A host's login shell, whatever it is and whatever it prints: the command line every shell
passes on unchanged, and the mark that says where gpumon's own output begins.

ssh hands the remote command line to the user's login shell, which may be bash, zsh, fish, tcsh
or dash, each with its own quoting (`\\` in fish's single quotes, `!` in tcsh's, `$` in none but
sh's). So the line ssh is given is made only of characters no shell treats specially inside
single quotes: `exec sh -c 'eval "$(echo PAYLOAD|base64 -d)"'`, where PAYLOAD is the base64 of a
POSIX sh script; sh, not the login shell, reads every argument.

A login may print before that script runs (a conda banner, an `echo` in ~/.bashrc, a fish
greeting in config.fish). The script prints a random mark of its own connection first, and the
reader skips everything up to and including it (at most MAX_BANNER bytes: a login that prints
more is broken, and is said to be). The mark travels base64-encoded, so a login that echoes the
command line (`set -x`) cannot print it early.
"""

from __future__ import annotations

import base64
import io
import os
from typing import BinaryIO

MARK_PREFIX = "gpumon-says-"
MAX_BANNER = 256 << 10  # a long motd or conda banner fits many times over


class BannerTooLong(ValueError):
    """The login printed more than MAX_BANNER bytes before gpumon's mark (or never printed it)."""


def new_mark() -> bytes:
    """A mark for one connection: unguessable, printable, one word for sh."""
    return (MARK_PREFIX + os.urandom(12).hex()).encode()


def any_shell(script: str) -> str:
    """The remote command line that runs the POSIX sh `script` under any login shell."""
    payload = base64.b64encode(script.encode()).decode()
    return f"exec sh -c 'eval \"$(echo {payload}|base64 -d)\"'"


def marked(script: str, mark: bytes | None) -> str:
    """`script` for any login shell, printing `mark` on a line of its own first (None: no mark,
    for a terminal the user sees)."""
    if mark is not None:
        script = f"printf '%s\\n' {mark.decode()}; {script}"
    return any_shell(script)


def after_mark(data: bytes, mark: bytes) -> bytes | None:
    """What follows the mark's line in `data`; None when the mark is not in its first MAX_BANNER
    bytes. The mark may follow a banner that did not end its line."""
    line = mark + b"\n"
    at = data.find(line, 0, MAX_BANNER + len(line))
    return None if at < 0 else data[at + len(line):]


def is_mark(line: bytes, mark: bytes) -> bool:
    """The line that ends the login's banner (the mark, perhaps after a banner's unended line)."""
    return line.endswith(mark + b"\n")


class AfterMark(io.RawIOBase):
    """A child's stdout with the login's banner taken off: reads start after the mark. When the
    mark never comes (the login failed, or printed over MAX_BANNER), what was read is given as is."""

    def __init__(self, raw: BinaryIO, mark: bytes) -> None:
        super().__init__()
        self._raw = raw
        self._mark = mark
        self._pending: bytearray | None = None  # None: still looking for the mark

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._raw.fileno()

    def _skip(self) -> bytearray:
        seen = bytearray()
        while len(seen) <= MAX_BANNER + len(self._mark):
            chunk = self._raw.read1(65536)  # type: ignore[attr-defined]
            if not chunk:
                return bytearray()  # ended before gpumon spoke: its stderr says why
            seen += chunk
            rest = after_mark(bytes(seen), self._mark)
            if rest is not None:
                return bytearray(rest)
        return seen

    def readinto(self, buffer) -> int:  # type: ignore[override]
        if self._pending is None:
            self._pending = self._skip()
        if self._pending:
            n = min(len(buffer), len(self._pending))
            buffer[:n] = self._pending[:n]
            del self._pending[:n]
            return n
        chunk = self._raw.read1(len(buffer))  # type: ignore[attr-defined]
        buffer[:len(chunk)] = chunk
        return len(chunk)

    def close(self) -> None:
        self._raw.close()
        super().close()


def reader_after_mark(raw: BinaryIO, mark: bytes) -> io.BufferedReader:
    return io.BufferedReader(AfterMark(raw, mark))
