"""The run dialog's command history: the lines typed, newest first, kept in the state folder."""

from __future__ import annotations

from gpumon.jobs.files import state_dir, write_atomic


def command_history(limit: int = 100) -> list[str]:
    path = state_dir() / "history"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return list(dict.fromkeys(reversed(lines)))[:limit]  # newest first, no repeats


def remember_command(command: str) -> None:
    path = state_dir() / "history"
    history = [c for c in reversed(command_history(200)) if c != command] + [command]
    write_atomic(path, "\n".join(history[-200:]) + "\n")
