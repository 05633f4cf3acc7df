"""Claims: a job holds its cards on this host from the moment they are chosen until it ends.

A claim is one record per card in the shared place (folder.py), `claim.<card>.<job>.<random>`, held
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
from gpumon.sharing.records import MAX_TEXT, HeldRecords, create, inherited, name_part, name_parts, record_name, records
from gpumon.units import format_time

PREFIX = "claim"


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


def read(directory: Path) -> dict[str, list[Claim]]:
    """Every live claim of the place, by card (oldest first)."""
    found: dict[str, list[Claim]] = {}
    for record in sorted(records(directory, PREFIX), key=lambda r: r.changed_ns):
        card = record.card()
        if card is None:
            continue
        found.setdefault(card, []).append(Claim(
            card=card, user=record.user, uid=record.uid, job=record.text("job"), name=record.text("name"),
            since=record.number("since"), host=record.text("host"), pid=record.whole("pid")))
    return found


def claim(directory: Path, cards: list[str], job: str, name: str) -> HeldRecords:
    """Claim `cards` for `job` (the caller holds the place's lock, having checked they are free)."""
    hold = HeldRecords([])
    try:
        for card in cards:
            hold.items.append(create(directory, record_name(PREFIX, card, job), {
                    "card": card, "job": job, "name": name[:MAX_TEXT], "since": time.time(),
                    "host": socket.gethostname(), "pid": os.getpid()}))
    except Exception:
        hold.release()
        raise
    return hold


def adopt(directory: Path, job: str) -> HeldRecords:
    """The claims of `job` this process was handed by its launcher."""
    return HeldRecords([(fd, path) for fd, path in inherited(directory, PREFIX)
                 if name_parts(path)[1:2] == [name_part(job)]])
