"""Claims: a job holds its cards on this host from the moment they are chosen until it ends.

A claim is one record per card in the shared place (place.py), `claim.<card>.<job>.<random>`, held
with an flock by the job's launcher and then its supervisor: it ends with them, however they end.
Who claimed is the file's owner; the rest (job, name, since) is what the claimant wrote, shown as data.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.sanitize import printable
from gpumon.sharing.place import Hold, create, inherited, name_part, records
from gpumon.units import format_time

PREFIX = "claim"
MAX_TEXT = 80


@dataclass(frozen=True)
class Claim:
    card: str  # the card's UUID (or PCI bus id), or a MIG slice's UUID
    user: str
    uid: int
    job: str
    name: str
    since: float | None
    host: str
    pid: int | None

    def words(self) -> str:
        """'claimed by alice: job 3f2a train.py, since 10:02' (their text made printable)."""
        when = f", since {format_time(self.since)}" if self.since else ""
        return f"claimed by {printable(self.user)}: job {printable(self.job)} {printable(self.name)}{when}"

    def to_dict(self) -> dict[str, Any]:
        return {"user": self.user, "job": self.job, "name": self.name, "since": self.since, "host": self.host}


def _text(value: Any) -> str:
    return str(value)[:MAX_TEXT] if isinstance(value, (str, int)) else ""


def read(directory: Path) -> dict[str, list[Claim]]:
    """Every live claim of the place, by card (oldest first)."""
    found: dict[str, list[Claim]] = {}
    for record in sorted(records(directory, PREFIX), key=lambda r: r.changed_ns):
        data = record.data
        card = data.get("card")
        if not isinstance(card, str) or not 0 < len(card) <= 96:
            continue
        since = data.get("since")
        pid = data.get("pid")
        found.setdefault(card, []).append(Claim(
            card=card, user=record.user, uid=record.uid, job=_text(data.get("job")), name=_text(data.get("name")),
            since=float(since) if isinstance(since, (int, float)) else None, host=_text(data.get("host")),
            pid=pid if isinstance(pid, int) else None))
    return found


def claim(directory: Path, cards: list[str], job: str, name: str) -> Hold:
    """Claim `cards` for `job` (the caller holds the place's lock, having checked they are free)."""
    hold = Hold([])
    try:
        for card in cards:
            hold.items.append(create(directory, f"{PREFIX}.{name_part(card)}.{name_part(job)}", {
                    "card": card, "job": job, "name": name[:MAX_TEXT], "since": time.time(),
                    "host": socket.gethostname(), "pid": os.getpid()}))
    except Exception:
        hold.release()
        raise
    return hold


def adopt(directory: Path, job: str) -> Hold:
    """The claims of `job` this process was handed by its launcher."""
    return Hold([(fd, path) for fd, path in inherited(directory, PREFIX)
                 if path.name.split(".")[2:3] == [name_part(job)]])
