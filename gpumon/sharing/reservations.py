"""Reservations: a user books cards for a while (`gpumon reserve --gpu 1 --for 2h`).

A reservation is a record in the shared place (folder.py), `reserve.<card>.<random>`, owned by the
user who made it (stat), with its end time and note inside. It is not held by a process: it ends
at its time, when its holder releases it, or when the holder has had no process on the card for
its idle release: the host's `[claims] idle_release` (the system config's, default 30 minutes),
or the shorter one its holder's own config asked for, written in the record when it was made.
Every reader judges a reservation by that same rule, whatever its own config says.

Its times are the kernel's, which no owner can set: it starts when the file was put in place (its
change time), so it is ordered by that, and lasts at most a week from then, whatever it says. A
file changed after it was made (touched, chmod) is no reservation: its change time moved. The
holder's gpumon notes use of the card on a second file, `reserve-use.<card>.<random>`, whose change
time is the last use; touching that by hand (`touch -d 2099`) counts as one use now, not as a use
in 2099. Only the holder can remove either file (the folder is sticky). Everyone else's
placement skips a reserved card; the holder's prefers it.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpumon.model import Snapshot
from gpumon.sanitize import printable
from gpumon.sharing.folder import IDLE_RELEASE_S
from gpumon.sharing.records import Record, create, record_name, records
from gpumon.units import format_time

PREFIX = "reserve"
USE_PREFIX = "reserve-use"
MAX_NOTE = 200
LONGEST_S = 7 * 86400.0  # a week: longer is a dedicated machine, not a reservation
TOUCH_EVERY_S = 60.0  # the holder's use is noted at most this often (a utime per card)
WRITTEN_WITHIN_S = 2.0  # how far the time a reservation says it was made may be from the kernel's


@dataclass(frozen=True)
class Reservation:
    card: str  # UUID (or PCI bus id)
    index: int | None  # the card's index when it was reserved
    user: str
    uid: int
    until: float
    note: str
    created: float
    used: float  # the last time the holder's use of the card was noted (the file's mtime)
    host: str
    path: Path
    idle_release: float = IDLE_RELEASE_S  # seconds unused after which it ends (see the module's rule)

    def words(self) -> str:
        """'reserved by alice until 14:00: "paper deadline"' (their note made printable)."""
        note = f': "{printable(self.note)}"' if self.note else ""
        return f"reserved by {printable(self.user)} until {format_time(self.until)}{note}"

    def to_dict(self) -> dict[str, Any]:
        return {"user": self.user, "until": self.until, "note": self.note, "since": self.created,
                "card": self.card, "index": self.index, "mine": self.mine}

    @property
    def mine(self) -> bool:
        return self.uid == os.geteuid()


@dataclass(frozen=True)
class Ended:
    """A reservation that ended since it was last read: `why` is "expired" or "idle"."""

    reservation: Reservation
    why: str


def read(directory: Path, snapshot: Snapshot | None = None, idle_release: float = IDLE_RELEASE_S,
         now: float | None = None, ended: list[Ended] | None = None,
         seen: dict[str, float] | None = None) -> dict[str, Reservation]:
    """Reservations in force, by card. With a `snapshot`, a holder's process on the card is use
    (noted, for our own); one unused for its idle release is over: `idle_release` (the host's
    limit), or the shorter one written in the record. Over ones are skipped (and ours
    removed); `ended` collects them. `seen`: a long-running reader's memory of when it last saw
    each in use (by file name), for the holders it cannot note use for."""
    now = time.time() if now is None else now
    users_on: dict[str, set[int | str]] = {}  # card -> the uids and user names of its processes
    if snapshot is not None:
        for gpu in snapshot.gpus:
            who: set[int | str] = {p.uid for p in gpu.processes if p.uid is not None}
            who |= {p.user for p in gpu.processes if p.user}
            for ref in (gpu.uuid, gpu.pci_bus_id, *(m.uuid for m in gpu.mig_devices)):
                if ref:
                    users_on[ref] = who
    found: dict[str, Reservation] = {}
    for record in records(directory, PREFIX, locked=False):
        card, until, written = record.card(), record.number("until"), record.number("created")
        if card is None or until is None or written is None or abs(written - record.changed) > WRITTEN_WITHIN_S:
            continue  # not one, or changed after it was made
        asked = record.number("idle_release")
        r = Reservation(card=card, index=record.whole("index"), user=record.user, uid=record.uid,
                        until=min(until, record.changed + LONGEST_S), note=record.text("note", MAX_NOTE),
                        created=record.changed, used=_last_use(record), host=record.text("host"), path=record.path,
                        idle_release=min(asked, idle_release) if asked is not None and asked > 0 else idle_release)
        in_use = bool(users_on.get(card, set()) & {r.uid, r.user})
        if in_use:
            r = _note_use(r, now)
            if seen is not None:
                seen[r.path.name] = now
        elif seen is not None and seen.get(r.path.name, 0.0) > r.used:
            r = Reservation(**{**r.__dict__, "used": seen[r.path.name]})
        why = "expired" if r.until <= now else ("idle" if not in_use and now - r.used >= r.idle_release else None)
        if why:
            if r.mine:
                withdraw(r.path)
            if ended is not None:
                ended.append(Ended(r, why))
            continue
        if card not in found or (r.created, r.path.name) < (found[card].created, found[card].path.name):
            found[card] = r  # the first booking stands
    return found


def use_note(path: Path) -> Path:
    """Where the holder of the reservation at `path` notes its use."""
    return path.with_name(USE_PREFIX + path.name.removeprefix(PREFIX))


def _last_use(record: Record) -> float:
    """When the holder last noted use: the note's change time (the kernel's), if the note is theirs."""
    try:
        st = os.lstat(use_note(record.path))
    except OSError:
        return record.changed
    if st.st_uid != record.uid or not stat.S_ISREG(st.st_mode):
        return record.changed
    return max(record.changed, st.st_ctime)


def withdraw(path: Path) -> None:
    path.unlink(missing_ok=True)
    use_note(path).unlink(missing_ok=True)


def _touch(path: Path, now: float) -> None:
    """Note use of our reservation at `path` (its change time becomes now, whatever `now` says)."""
    note = use_note(path)
    try:
        fd = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError:
        return
    try:
        os.utime(fd, (now, now))
    except OSError:
        pass
    finally:
        os.close(fd)


def _note_use(r: Reservation, now: float) -> Reservation:
    if r.mine and now - r.used >= TOUCH_EVERY_S:
        _touch(r.path, now)
    return Reservation(**{**r.__dict__, "used": now})


def note_use(directory: Path, cards: set[str], now: float | None = None) -> None:
    """Our reservations of `cards` are in use now (a job of ours runs there: its supervisor says so)."""
    now = time.time() if now is None else now
    for record in records(directory, PREFIX, locked=False):
        if record.uid == os.geteuid() and record.card() in cards:
            _touch(record.path, now)


def reserve(directory: Path, cards: list[tuple[str, int]], until: float, note: str,
            idle_release: float | None = None) -> list[Path]:
    """Book `cards` (reference, index) until `until`; the caller holds the place's lock.
    `idle_release`: the holder's own shorter release, written for every reader to honour."""
    made = []
    asked = {"idle_release": idle_release} if idle_release is not None else {}
    for card, index in cards:
        fd, path = create(directory, record_name(PREFIX, card), {
            "card": card, "index": index, "until": until, "note": note[:MAX_NOTE], "created": time.time(),
            "host": socket.gethostname(), **asked}, locked=False)
        os.close(fd)
        made.append(path)
    return made


def release(found: dict[str, Reservation], cards: set[str] | None = None) -> list[Reservation]:
    """Remove our own reservations (of `cards`, or all); the released ones."""
    gone = []
    for r in found.values():
        if r.mine and (cards is None or r.card in cards):
            withdraw(r.path)
            gone.append(r)
    return gone


@dataclass(frozen=True, slots=True)
class ReservationEvent:
    """A reservation of a card ended by itself (gpumon/sharing/reservations.py): its holder had
    no process on the card for its idle release, or its time was up. `watch` emits it."""

    host: str
    gpu: int | None
    uuid: str
    user: str
    note: str
    until: float
    reason: str  # "unused for 30m", "its time was up"
    time: float
    event: str = "reservation_released"

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "host": self.host, "gpu": self.gpu, "uuid": self.uuid, "user": self.user,
                "note": self.note, "until": self.until, "reason": self.reason, "time": self.time}
