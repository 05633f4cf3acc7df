"""A job's attempts: each time its command was started, on which cards, how that ended, and why
it moved to other cards (`--failover`). Kept in the job's directory as `attempts.json`, written
atomically by the supervisor when an attempt starts and when it ends.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpumon.units import format_time

RECORD = "attempts.json"


@dataclass
class Attempt:
    number: int  # 1 for the first start
    gpus: list[str]  # UUIDs (MIG slices by MIG UUID)
    gpu_indices: list[int]
    pid: int | None
    started: float
    ended: float | None = None
    exit_code: int | None = None
    signal: str | None = None  # "SIGTERM": what ended it, when a signal did
    moved_because: str | None = None  # why the job left these cards (None: it did not)

    def to_dict(self) -> dict[str, Any]:
        """An entry of `attempts.json`, and of `attempts` in `gpumon jobs --json`."""
        out = asdict(self)
        return {"attempt": out.pop("number")} | out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Attempt:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(number=data["attempt"], **known)


def load_attempts(directory: Path) -> list[Attempt]:
    """The job's attempts, first first; [] for jobs that never started and older records."""
    try:
        data = json.loads((directory / RECORD).read_text())
        return [Attempt.from_dict(a) for a in data if isinstance(a, dict)]
    except (OSError, ValueError, TypeError, KeyError):
        return []


def attempts_json(attempts: list[Attempt]) -> str:
    return json.dumps([a.to_dict() for a in attempts], indent=1)


def banner(number: int, most: int, indices: list[int], uuids: list[str], why_moved: str | None) -> str:
    """Where an attempt begins, in the job's output: `=== gpumon: attempt 2 of at most 3 on GPU 1, after … ===`."""
    return (f"=== gpumon: attempt {number} of at most {most} on {_cards(indices)}"
            f"{f', after {why_moved}' if why_moved else ''}"
            f" ({time.strftime('%Y-%m-%d %H:%M:%S')}, {', '.join(uuids)}) ===\n")


def describe(attempt: Attempt) -> str:
    """One attempt for people: 'attempt 1: GPU 0, Mon 12:00:01 to 12:00:09, SIGTERM; moved: GPU 0 is lost'."""
    cards = _cards(attempt.gpu_indices)
    when = f"since {format_time(attempt.started, seconds=True)}"
    if attempt.ended is not None:
        # An end on its start's day needs no day of its own.
        same_day = time.localtime(attempt.started)[:3] == time.localtime(attempt.ended)[:3]
        end = format_time(attempt.ended, now=attempt.started if same_day else None, seconds=True)
        when = f"{format_time(attempt.started, seconds=True)} to {end}"
    how = attempt.signal or ("" if attempt.exit_code is None else f"exit {attempt.exit_code}")
    return (f"attempt {attempt.number}: {cards}, {when}" + (f", {how}" if how else "")
            + (f"; moved: {attempt.moved_because}" if attempt.moved_because else ""))


def _cards(indices: list[int]) -> str:
    """'GPU 0', 'GPUs 0,1'."""
    return ("GPU " if len(indices) == 1 else "GPUs ") + ",".join(map(str, indices))

