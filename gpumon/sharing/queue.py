"""The host's queue of jobs waiting for cards (`run --wait`), every user's, first come first served.

An entry is a record in the shared place (folder.py), `queue.<job>.<random>`, held with an flock by
the job's launcher and then its supervisor: a job whose supervisor is gone has left the queue. The
order is the kernel's time of putting each entry in place (st_ctime), not a time written inside.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.sanitize import printable
from gpumon.sharing.folder import MAX_TEXT, HeldRecords, create, inherited, name_part, name_parts, record_name, records
from gpumon.units import format_time

PREFIX = "queue"


@dataclass(frozen=True)
class Entry:
    position: int  # 1: next to start
    user: str
    uid: int
    job: str
    name: str
    gpu_spec: str
    queued: float  # when it joined (unix s)
    host: str
    path: Path

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "user": self.user, "job": self.job, "name": self.name,
                "gpu_spec": self.gpu_spec, "queued": self.queued, "host": self.host}

    def words(self, numbered: bool = True) -> str:
        number = f"{self.position}. " if numbered else ""
        return (f"{number}{printable(self.user)}: job {printable(self.job)} {printable(self.name)} "
                f"wants {printable(self.gpu_spec)}, queued {format_time(self.queued, seconds=True)}")


def read(directory: Path) -> list[Entry]:
    """The live entries, first in line first."""
    live = sorted(records(directory, PREFIX), key=lambda r: (r.changed_ns, r.path.name))
    return [Entry(position=i, user=r.user, uid=r.uid, job=r.text("job"), name=r.text("name"),
                  gpu_spec=r.text("gpu_spec") or "auto", queued=r.changed_ns / 1e9, host=r.text("host"), path=r.path)
            for i, r in enumerate(live, start=1)]


def enqueue(directory: Path, job: str, name: str, gpu_spec: str) -> HeldRecords:
    return HeldRecords([create(directory, record_name(PREFIX, job), {
        "job": job, "name": name[:MAX_TEXT], "gpu_spec": gpu_spec[:MAX_TEXT], "host": socket.gethostname(),
        "pid": os.getpid()})])


def adopt(directory: Path, job: str) -> HeldRecords:
    """The queue entry of `job` this process was handed by its launcher."""
    return HeldRecords([(fd, path) for fd, path in inherited(directory, PREFIX)
                 if name_parts(path)[:1] == [name_part(job)]])
