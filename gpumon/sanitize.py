"""Text that comes from other users or the driver (command lines, user and card names) made safe
to print: no terminal control sequences (a process named "\\x1b]0;pwned\\x07" must not reach the
terminal), no undecodable bytes (shown as U+FFFD instead of crashing the UI), and no invisible
characters that change how the rest is laid out or read: bidi controls (a right-to-left override
can make `rm -rf ~ #txt.py` look like something else in a kill confirmation), zero-width
characters and line separators. All of these are shown as visible escapes (`\\x1b`, `\\u202e`)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Bidi embeddings, overrides and isolates, zero-width characters and direction marks, line and
# paragraph separators, the byte-order mark, the Arabic letter mark.
_INVISIBLE = re.compile("[\u202a-\u202e\u2066-\u2069\u200b-\u200f\u2028\u2029\ufeff\u061c]")


def printable(text: str) -> str:
    if text.isascii() and text.isprintable():
        return text
    # psutil decodes with surrogateescape: turn undecodable bytes into U+FFFD.
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text.replace("\t", " ").replace("\n", " "))
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
