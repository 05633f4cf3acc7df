"""The first frame, drawn before Textual is even imported.

Importing Textual and building the app takes ~0.5 s on a small VM; a terminal left blank that long
looks hung. So the TUI first writes one status line on the terminal's alternate screen (where
Textual will draw), then starts Textual, which draws over it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

ENTER = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"  # alternate screen, cursor hidden, cleared
LEAVE = "\x1b[?25h\x1b[?1049l"


def show(text: str) -> Callable[[], None]:
    """Write ' gpumon  TEXT' at the top of the alternate screen; returns how to take it down again
    (for when Textual never starts). Nothing happens when stdout is not a terminal."""
    if not sys.stdout.isatty() or os.environ.get("TERM", "dumb") == "dumb":
        return lambda: None
    sys.stdout.write(f"{ENTER}\x1b[1m gpumon \x1b[0m {text}")
    sys.stdout.flush()

    def take_down() -> None:
        sys.stdout.write(LEAVE)
        sys.stdout.flush()

    return take_down
