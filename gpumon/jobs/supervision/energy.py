"""The energy a job's cards used while it ran, from the cards' energy counters (jobs/supervision/supervisor.py).

The supervisor samples the job's cards anyway (the watchdog); each attempt's first and last
reading of each card's counter give what that card used meanwhile, and the job's energy is the sum
over its cards and attempts, in `energy.json` (read by jobs/records.py):
`{"energy_j": float|null, "energy_shared": bool}`.
A card counts whole: when another process used one of the job's cards while it ran (another job,
another user), part of that energy is theirs, and `energy_shared` says so. `null`: no card of the
job reported an energy counter (a driver before Volta, a backend without one).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from gpumon.jobs.files import write_atomic
from gpumon.model import Snapshot

RECORD = "energy.json"


class JobEnergy:
    def __init__(self, directory: Path, write: Callable[[str, str], object] | None = None) -> None:
        self.path = directory / RECORD
        # How the record is written (the supervisor's: best effort, jobs/supervision/best_effort_writes.py).
        self._write = write or (lambda name, text: write_atomic(directory / name, text))
        self.used: float | None = None  # joules of the attempts that ended
        self.shared = False
        self._first: dict[int, float] = {}  # this attempt's first and last reading, by card index
        self._last: dict[int, float] = {}

    def see(self, snapshot: Snapshot, cards: set[int], pids: Iterable[int] | None) -> None:
        """A sample of the job's cards: each card's counter, and (with the job's `pids`; None after
        it ended) whether anyone else used the card."""
        ours = None if pids is None else set(pids)
        for gpu in snapshot.gpus:
            if gpu.index not in cards:
                continue
            joules = gpu.counters.energy_j if gpu.counters is not None else None
            if joules is not None:
                self._first.setdefault(gpu.index, joules)
                self._last[gpu.index] = joules
            if ours is not None and any(p.pid not in ours for p in gpu.processes):
                self.shared = True

    def attempt_ended(self) -> None:
        """Adds the attempt's energy and writes the record (the last sample was taken after the end)."""
        if self._first:
            # A counter that went back (the driver reloaded) counts from its new start.
            spent = sum(max(0.0, self._last[i] - self._first[i]) for i in self._first)
            self.used = (self.used or 0.0) + spent
        self._first, self._last = {}, {}
        self._write(RECORD, json.dumps({"energy_j": None if self.used is None else round(self.used, 3),
                                        "energy_shared": self.shared}))

