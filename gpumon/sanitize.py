"""Text that comes from other users or the driver (command lines, user and card names) made safe
to print: no terminal control sequences (a process named "\\x1b]0;pwned\\x07" must not reach the
terminal), and no undecodable bytes (shown as U+FFFD instead of crashing the UI)."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    if text.isascii() and text.isprintable():
        return text
    # psutil decodes with surrogateescape: turn undecodable bytes into U+FFFD.
    text = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text.replace("\t", " ").replace("\n", " "))
