"""The host's queue of jobs waiting for cards (`run --wait`), every user's, first come first served.

An entry is a record in the shared place (folder.py), `queue.<job>.<random>`, held with an flock by
the job's launcher and then its supervisor: a job whose supervisor is gone has left the queue, and
an entry with no gpumon supervisor of its owner's behind it (any user can flock a file) is not in
line. The order is the kernel's time of putting each entry in place (st_ctime), not a time written
inside. An entry says what its job asks for (how many cards, which, how much free memory), so that
the jobs behind it may start on cards it could never use (backfill) without delaying it.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpumon.sanitize import printable
from gpumon.sharing import records as shared
from gpumon.sharing.records import MAX_TEXT, HeldRecords, Record, create, inherited, name_part, name_parts, record_name
from gpumon.units import format_time

PREFIX = "queue"


SUPERVISOR = b"gpumon.jobs.supervision.supervisor"


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
    count: int = 1  # cards it asks for
    cards: tuple[str, ...] = ()  # the cards it named (UUIDs); () for any
    min_free: int | None = None  # bytes free it needs on each card
    reason: str = ""  # why it waits, in words

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "user": self.user, "job": self.job, "name": self.name,
                "gpu_spec": self.gpu_spec, "queued": self.queued, "host": self.host, "reason": self.reason}

    def words(self, numbered: bool = True) -> str:
        number = f"{self.position}. " if numbered else ""
        why = f"; {self.reason}" if self.reason else ""
        return (f"{number}{printable(self.user)}: job {printable(self.job)} {printable(self.name)} "
                f"wants {printable(self.gpu_spec)}, queued {format_time(self.queued, seconds=True)}{why}")


def read(directory: Path, supervised: bool = True) -> list[Entry]:
    """The entries in line, first in line first, each with why it waits (`supervised`: only those
    with their owner's gpumon supervisor behind them; False: every held entry)."""
    live = sorted(shared.records(directory, PREFIX), key=lambda r: (r.changed_ns, r.path.name))
    behind = _supervised(live) if supervised else set()
    entries: list[Entry] = []
    for r in live:
        if supervised and (r.uid, name_part(r.text("job"))) not in behind:
            continue
        cards = r.data.get("cards")
        entries.append(Entry(
            position=len(entries) + 1, user=r.user, uid=r.uid, job=r.text("job"), name=r.text("name"),
            gpu_spec=r.text("gpu_spec") or "auto", queued=r.changed, host=r.text("host"), path=r.path,
            count=max(1, min(r.whole("count") or 1, 1024)),
            cards=tuple(c for c in cards[:64] if isinstance(c, str) and len(c) <= MAX_TEXT)
            if isinstance(cards, list) else (),
            min_free=r.whole("min_free")))
    return [replace(e, reason=_reason(e, entries[0])) for e in entries]


def _reason(entry: Entry, first: Entry) -> str:
    if entry is first:
        return f"first in line: waits until {printable(entry.gpu_spec)} can start on free cards"
    return (f"behind {printable(first.user)}'s {printable(first.gpu_spec)} (job {printable(first.job)}); "
            f"starts sooner only on cards that job cannot use")


def _supervised(live: list[Record]) -> set[tuple[int, str]]:
    """(owner, job) of every gpumon supervisor running for an entry's owner: an entry whose owner
    runs none for its job is a held file, not a job in line."""
    if not live:
        return set()
    if not _sees_others():  # /proc mounted hidepid: nobody's supervisor can be seen, so all count
        return {(r.uid, name_part(r.text("job"))) for r in live}
    owners = {r.uid for r in live}
    found = set()
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return set()
    for pid in pids:
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
            if uid not in owners:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                argv = file.read(8192).split(b"\0")
        except OSError:
            continue
        if SUPERVISOR in argv and len(argv) >= 2:
            job = os.path.basename(argv[-2] if argv[-1] == b"" else argv[-1]).decode("utf-8", "replace")
            found.add((uid, name_part(job)))
    return found


def enqueue(directory: Path, job: str, name: str, gpu_spec: str, count: int = 1, cards: Sequence[str] = (),
            min_free: int | None = None) -> HeldRecords:
    """Join the queue, saying what the job asks for (`count` cards, of `cards` if it named them,
    each with `min_free` bytes free), so those behind it know which cards it could use."""
    return HeldRecords([create(directory, record_name(PREFIX, job), {
        "job": job, "name": name[:MAX_TEXT], "gpu_spec": gpu_spec[:MAX_TEXT], "host": socket.gethostname(),
        "pid": os.getpid(), "count": count, "cards": list(cards), "min_free": min_free})])


def _sees_others() -> bool:
    """Whether /proc shows other users' processes (not with hidepid=1/2, except to root)."""
    try:
        with open("/proc/1/cmdline", "rb") as file:
            file.read(1)
    except OSError:
        return False
    return True


def adopt(directory: Path, job: str) -> HeldRecords:
    """The queue entry of `job` this process was handed by its launcher."""
    return HeldRecords([(fd, path) for fd, path in inherited(directory, PREFIX)
                 if name_parts(path)[:1] == [name_part(job)]])
