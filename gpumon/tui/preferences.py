"""What the user chose in the TUI, kept for the next start (as nvtop keeps its setup): the process
table's sort column and direction, the theme, the chart window, whether the process table
shows every card's processes or the selected card's, the users view's sort and the fleet
overview's sort.

Kept in the state folder (`~/.local/state/gpumon/tui.json`, platformdirs' user_state_dir), one
JSON object; deleting it resets them. Each change is written at once (atomically: a kill leaves
the old file or the new one), in a thread of its own so a slow home directory (NFS) never holds
up a key, and merged into what the file holds then, so two gpumons that change different choices
keep both. Options given on the command line win over these (cli/tui.py). A file that cannot be
read or makes no sense is ignored, said once in the status line; a folder that cannot be written
(read-only, full) is said once, and the TUI goes on with the choices in memory.

The low-bandwidth mode (`b`) is not kept: it is about the link of one session (it also switches
on by itself), not a way the user likes to see the screen.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from gpumon.jobs.files import state_dir, write_atomic

log = logging.getLogger(__name__)
FILE_NAME = "tui.json"


@dataclass(frozen=True)
class Preferences:
    """None: not chosen (the default, or the command line's, applies)."""

    sort: str | None = None  # a ProcessTable sort key: gpu_mem, sm, cpu, pid, user, age, owner
    sort_reverse: bool | None = None  # True: largest first
    theme: str | None = None
    window: int | None = None  # seconds of history the charts show
    all_cards: bool | None = None  # the process table shows every card's processes
    hosts_sort: str | None = None  # the fleet overview's sort (`o`): listed, free, load, name, health
    hosts_sort_reverse: bool | None = None
    users_sort: str | None = None  # the users view's (`u`) HolderTable sort key: who, idle, mem, sm, …
    users_sort_reverse: bool | None = None


_TYPES: dict[str, type] = {"sort": str, "sort_reverse": bool, "theme": str, "window": int, "all_cards": bool,
                           "hosts_sort": str, "hosts_sort_reverse": bool, "users_sort": str, "users_sort_reverse": bool}


def preferences_path() -> Path:
    return state_dir() / FILE_NAME


def _parse(data: Any) -> tuple[Preferences, list[str]]:
    """The choices in `data`, and the names of those that were not of their type."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    known, bad = {}, []
    for field in fields(Preferences):
        value = data.get(field.name)
        if value is None:
            continue
        kind = _TYPES[field.name]
        if type(value) is kind:  # noqa: E721 - bool is an int: exactly the type, not a subclass
            known[field.name] = value
        else:
            bad.append(field.name)
    return Preferences(**known), bad


class PreferenceStore:
    """The choices read at start, changed as the user makes them, written in the background.
    `path` None: kept in memory only (the tests' and screenshots' apps)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.saved = Preferences()
        self.problem: str | None = None  # why the file was not read, or not written (said once)
        self._lock = threading.Lock()  # one write at a time, of every choice not yet written
        self._pending: dict[str, Any] = {}
        self._write_failed = False
        self.on_problem: Callable[[str], None] = lambda problem: None  # set by the app

    @classmethod
    def load(cls, path: Path | None = None) -> PreferenceStore:
        store = cls(path or preferences_path())
        try:
            text = store.path.read_text()
        except FileNotFoundError:
            return store
        except OSError as exc:
            store.problem = f"preferences not read ({exc.strerror or exc}): {store.path}"
            return store
        try:
            store.saved, bad = _parse(json.loads(text))
        except json.JSONDecodeError as exc:
            store.problem = f"preferences ignored (not JSON: line {exc.lineno}): {store.path}"
            return store
        except ValueError as exc:
            store.problem = f"preferences ignored ({exc}): {store.path}"
            return store
        if bad:
            store.problem = f"preferences: ignored {', '.join(bad)} (wrong type) in {store.path}"
        return store

    def change(self, **choices: Any) -> None:
        """Keep these choices (names of Preferences' fields) and write them, in a thread."""
        self.saved = replace(self.saved, **choices)
        if self.path is None:
            return
        with self._lock:
            self._pending.update(choices)
        threading.Thread(target=self._write, name="gpumon-preferences", daemon=True).start()

    def _write(self) -> None:
        assert self.path is not None
        with self._lock:
            if not self._pending:  # an earlier thread wrote them
                return
            changes, self._pending = self._pending, {}
            try:
                try:
                    on_disk = json.loads(self.path.read_text())
                except (OSError, ValueError):
                    on_disk = {}
                merged = on_disk if isinstance(on_disk, dict) else {}
                merged.update(changes)  # only what this gpumon changed: another's choices stay
                write_atomic(self.path, json.dumps(merged, indent=1, sort_keys=True) + "\n")
            except OSError as exc:
                log.info("preferences not written: %s", exc)
                if not self._write_failed:  # said once, not at every key
                    self._write_failed = True
                    self.on_problem(f"preferences not saved ({exc.strerror or exc}): {self.path}")
