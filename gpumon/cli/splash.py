"""The first frame, drawn before Textual is even imported.

Importing Textual and building the app takes ~0.5 s on a small VM; a terminal left blank that long
looks hung. So the TUI first writes one status line on the terminal's alternate screen (where
Textual will draw), then, as soon as the driver has named them (milliseconds, see
cli/open_driver_early.py), the cards; then it starts Textual, which draws over it.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

ENTER = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J"  # alternate screen, cursor hidden, cleared
LEAVE = "\x1b[?25h\x1b[?1049l"
BOLD, DIM, PLAIN = "\x1b[1m", "\x1b[2m", "\x1b[0m"
_up = False  # the terminal is on the alternate screen, entered here (Textual must not enter it again)


def _shown() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM", "dumb") != "dumb"


def show(text: str) -> Callable[[], None]:
    """Write ' gpumon  TEXT' at the top of the alternate screen; returns how to take it down again
    (for when Textual never starts). Nothing happens when stdout is not a terminal."""
    global _up
    if not _shown():
        return lambda: None
    sys.stdout.write(f"{ENTER}{BOLD} gpumon {PLAIN} {text}")
    sys.stdout.flush()
    _up = True

    def take_down() -> None:
        global _up
        if _up:
            sys.stdout.write(LEAVE)
            sys.stdout.flush()
            _up = False

    return take_down


def is_up() -> bool:
    """Whether the terminal is on the alternate screen that `show` entered. Entering it again
    would save the cursor of the alternate screen, and leaving would then put the shell's prompt
    there, over the lines it had printed before gpumon started."""
    return _up


def cards(identity: Any) -> None:
    """The status line and one line per card, from a Snapshot of the cards' names and ids (no
    values yet: those come with the first sample)."""
    if not _shown():
        return
    width = shutil.get_terminal_size().columns
    status = f" gpumon  {identity.host}  driver {identity.driver_version or 'N/A'}  " \
             f"CUDA {identity.cuda_driver_version or 'N/A'}  reading the cards…"
    lines = [f"\x1b[1;1H\x1b[2K{BOLD}{status[:width]}{PLAIN}"]
    for row, gpu in enumerate(identity.gpus, start=3):
        ids = "  ".join(x for x in ((gpu.uuid or "")[:12], (gpu.pci_bus_id or "").split(":", 1)[-1]) if x)
        name = gpu.name if gpu.state != "stale" else "(not answering yet)"
        line = f" {gpu.index:>2} {name}"
        lines.append(f"\x1b[{row};1H{BOLD}{line[:width]}{PLAIN}{DIM}{('  ' + ids)[:max(0, width - len(line))]}{PLAIN}")
    sys.stdout.write("".join(lines))
    sys.stdout.flush()
