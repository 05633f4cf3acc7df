"""One record of the shared place (folder.py): a small file one user writes and every user reads.

Another user's record is untrusted input, read as such: only plain files are opened (never a link,
a FIFO, a device or a folder), at most MAX_RECORD bytes of each, at most MAX_PER_USER records of a
kind from any one user (a flood costs its author, not the readers), and any content that is not a
small JSON object of finite numbers and short texts is not a record. Nothing here raises for what
another user wrote. Whose a record is and when it was put in place come from the kernel (the
file's owner and change time), never from what it says.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.sharing.folder import Unavailable, user_name

MAX_RECORD = 4096  # bytes: gpumon's own records are a few hundred
MAX_TEXT = 80  # characters of a record's text field kept (a job, a name, a host)
MAX_CARD = 96  # characters of a card's reference, as name_part keeps it
MAX_PER_USER = 256  # records of one kind read from one user (each card, job and booking is one)
LARGEST_NUMBER = 1e15  # beyond any time, size, pid or index gpumon writes
_LONGEST_INT = 19  # digits; a longer integer is no time, pid or size
_NAME_TRIES = 8
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_UNSAFE = re.compile(r"[^A-Za-z0-9-]")


def name_part(text: str) -> str:
    """A card's reference or a job id as part of a file name (bus ids have dots and colons)."""
    return _UNSAFE.sub("_", text)[:MAX_CARD] or "_"


def record_name(prefix: str, *parts: str) -> str:
    """`prefix.part…`, each part made safe: what `create` names a record (adding `.random`)."""
    return ".".join([prefix, *map(name_part, parts)])


def name_parts(path: Path) -> list[str]:
    """The parts record_name put in a record's file name, without its prefix and random end."""
    return path.name.split(".")[1:-1]


@dataclass
class HeldRecords:
    """Records this process holds (an flock on each, its own open file): they last until
    `release()`, or until every process holding the descriptors has ended."""

    items: list[tuple[int, Path]]

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(fd for fd, _ in self.items)

    @property
    def paths(self) -> list[Path]:
        return [path for _, path in self.items]

    def removed(self) -> list[tuple[int, Path]]:
        """Those whose file was removed under us (by the folder's owner, or root): the kernel
        counts no name left on the file we still hold."""
        gone = []
        for fd, path in self.items:
            try:
                if os.fstat(fd).st_nlink == 0:
                    gone.append((fd, path))
            except OSError:
                gone.append((fd, path))
        return gone

    def make_again(self, directory: Path) -> None:
        """Write again, from what we hold, each record someone removed (the folder's owner can):
        what it stood for still goes on."""
        for fd, path in self.removed():
            data = content(fd)
            if data is None:
                continue
            try:
                made = create(directory, path.name.split(" ", 1)[0].rsplit(".", 1)[0], data)
            except (Unavailable, OSError):
                continue
            os.close(fd)
            self.items[self.items.index((fd, path))] = made

    def close(self) -> None:
        """Let go of our descriptors only: a process they were handed to still holds the records."""
        for fd, _ in self.items:
            os.close(fd)
        self.items = []

    def release(self) -> None:
        for _, path in self.items:
            try:
                path.unlink()
            except OSError:
                pass
        self.close()

    def __bool__(self) -> bool:
        return bool(self.items)


def create(directory: Path, name: str, data: dict[str, Any], locked: bool = True) -> tuple[int, Path]:
    """A new record, written under a hidden name and renamed into place already locked, so no
    reader ever sees it unlocked (and takes it for a stale one). A name another user planted first
    only costs another random name (a sticky folder refuses to replace another's file)."""
    body = json.dumps(data).encode()
    for _ in range(_NAME_TRIES):
        final = directory / f"{name}.{os.urandom(4).hex()}"
        hidden = directory / f".{final.name}"
        if os.path.lexists(final):
            continue
        try:
            fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        except OSError as exc:
            raise Unavailable(f"cannot write in {directory}: {exc.strerror}") from None
        try:
            os.fchmod(fd, 0o644)
            if locked:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.write(fd, body)
            os.rename(hidden, final)  # the descriptor follows: /proc/self/fd names the record
        except OSError as exc:
            os.close(fd)
            hidden.unlink(missing_ok=True)
            if exc.errno in (errno.EPERM, errno.EEXIST, errno.EISDIR, errno.ENOTEMPTY):
                continue
            raise Unavailable(f"cannot write in {directory}: {exc.strerror}") from None
        return fd, final
    raise Unavailable(f"cannot write in {directory}: every name tried was taken")


def content(fd: int) -> dict[str, Any] | None:
    """What a record we hold says (None if it cannot be read back: held before gpumon read them)."""
    try:
        return _json(os.pread(fd, MAX_RECORD + 1, 0))
    except OSError:
        return None


@dataclass(frozen=True)
class Record:
    """A live record: whose it is from stat, the rest as its owner wrote it, read through the
    accessors below, each bounded, so that no record reads differently as a claim, a queue entry
    or a reservation."""

    path: Path
    uid: int
    user: str
    changed_ns: int  # st_ctime_ns: set by the kernel, never by the file's owner
    data: dict[str, Any]

    @property
    def changed(self) -> float:
        return self.changed_ns / 1e9

    def text(self, key: str, limit: int = MAX_TEXT) -> str:
        """A text field ('' when absent or not text; a number as written), cut to `limit`."""
        value = self.data.get(key)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            return ""
        return str(value)[:limit]

    def number(self, key: str) -> float | None:
        value = self.data.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        number = float(value)
        return number if math.isfinite(number) and abs(number) <= LARGEST_NUMBER else None

    def whole(self, key: str) -> int | None:
        value = self.data.get(key)
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return value if abs(value) <= LARGEST_NUMBER else None

    def card(self) -> str | None:
        """The card it is about (UUID, bus id, MIG slice), None when it names none."""
        card = self.data.get("card")
        return card if isinstance(card, str) and 0 < len(card) <= MAX_CARD else None


def _listed(directory: Path, prefix: str) -> Iterator[tuple[str, os.stat_result]]:
    """The plain files named `prefix.*`, small enough to be records, at most MAX_PER_USER of each
    owner (their first put in place): a listing and an lstat each, nothing opened."""
    try:
        with os.scandir(directory) as found:
            candidates = []
            for entry in found:
                if not entry.name.startswith(prefix + ".") or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and 0 < st.st_size <= MAX_RECORD:
                    candidates.append((entry.name, st))
    except OSError:
        return
    per_owner: dict[int, int] = {}
    for name, st in sorted(candidates, key=lambda c: (c[1].st_ctime_ns, c[0])):
        per_owner[st.st_uid] = per_owner.get(st.st_uid, 0) + 1
        if per_owner[st.st_uid] <= MAX_PER_USER:
            yield name, st


def records(directory: Path, prefix: str, locked: bool = True) -> list[Record]:
    """The live records named `prefix.*`: held (when `locked`) and readable. Our own stale ones
    are removed on the way (others' cannot be, in a sticky folder: they are skipped)."""
    found = []
    me = os.geteuid()
    for name, listed in _listed(directory, prefix):
        path = directory / name
        try:
            fd = os.open(path, _READ_FLAGS)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_ino != listed.st_ino:  # changed since listed
                continue
            if locked:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # held: alive
                else:  # nobody holds it: its process is gone
                    if st.st_uid == me:
                        path.unlink(missing_ok=True)
                    continue
            data = _json(os.read(fd, MAX_RECORD + 1))
            if data is not None:
                found.append(Record(path, st.st_uid, user_name(st.st_uid), st.st_ctime_ns, data))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES, errno.EAGAIN, errno.EIO):
                raise
        finally:
            os.close(fd)
    return found


def _no_constant(word: str) -> Any:
    raise ValueError(f"{word} is not a number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise ValueError("not a finite number")
    return number


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > _LONGEST_INT:
        raise ValueError("too long a number")
    return int(text)


def _json(raw: bytes) -> dict[str, Any] | None:
    """A small JSON object of finite numbers, or None: NaN, Infinity, 1e999, a 400-digit number,
    nesting deep enough to exhaust the parser, or more than MAX_RECORD bytes are no record."""
    if len(raw) > MAX_RECORD:
        return None
    try:
        data = json.loads(raw.decode("utf-8", "replace"), parse_constant=_no_constant, parse_float=_finite,
                          parse_int=_bounded_int)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def inherited(directory: Path, prefix: str) -> list[tuple[int, Path]]:
    """Descriptors this process was handed (pass_fds) on records `prefix.*` in `directory`."""
    held = []
    real = Path(os.path.realpath(directory))
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return []
    for entry in fds:
        try:
            target = Path(os.readlink(f"/proc/self/fd/{entry}"))
        except OSError:
            continue
        if target.parent == real and target.name.startswith(prefix + "."):
            held.append((int(entry), target))
    return held
