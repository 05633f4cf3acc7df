"""Whether stdin is a connection whose end means "stop": how a gpumon started by another program
(over ssh by a fleet, or by this machine's gpumon for `local`) learns that nobody reads it any
more — `snapshot --stream` and `jobs --log --follow` end with it."""

from __future__ import annotations

import os
import stat
import sys


def stdin_connection() -> int | None:
    """stdin's descriptor when it is a pipe or socket (ssh, a parent process); None for a
    terminal, a file or /dev/null."""
    try:
        fd = sys.stdin.fileno()
        mode = os.fstat(fd).st_mode
    except (OSError, ValueError, AttributeError):
        return None
    return fd if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) else None
