"""The run dialog's command history: the lines typed, newest first, kept in the state folder."""

from __future__ import annotations

import contextlib

from gpumon.jobs.files import state_dir, write_atomic


def command_history(limit: int = 100) -> list[str]:
    path = state_dir() / "history"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return list(dict.fromkeys(reversed(lines)))[:limit]  # newest first, no repeats


def remember_command(command: str) -> None:
    """Kept where it can be: a full or unwritable state folder costs the history, not the launch
    (which says what is wrong with the folder when it records the job)."""
    path = state_dir() / "history"
    history = [c for c in reversed(command_history(200)) if c != command] + [command]
    with contextlib.suppress(OSError):
        write_atomic(path, "\n".join(history[-200:]) + "\n")
