"""Who shares each card, for the views: its live claims and its reservation, read once per call
from the shared place (a listdir and one small read per record), keyed by the card's reference."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumon.model import GpuSample, Snapshot
from gpumon.sanitize import printable
from gpumon.sharing import claims, reservations
from gpumon.sharing import queue as queue_mod
from gpumon.sharing.folder import SharingSettings
from gpumon.sharing.reservations import Ended, Reservation, ReservationEvent
from gpumon.units import format_duration, format_time


@dataclass(frozen=True)
class CardSharing:
    claims: list[claims.Claim] = field(default_factory=list)
    reservation: Reservation | None = None


def card_words(card: CardSharing, me: int | None = None) -> tuple[str, str]:
    """Who has the card, as the views say it: (in full, in a few cells), both '' when nobody claims
    or reserves it. Full: 'claimed by alice: job 3f2a train.py, since 10:02; reserved by bob until
    Tue 18:00: "paper"'; short: 'alice: train.py' (the job's name), 'bob's →Tue 18:00'. The user's
    own claim and reservation read as theirs: 'yours: train.py', 'reserved by you until 18:00'. Text
    from the records is made printable."""
    me = os.geteuid() if me is None else me
    full, short = [], []
    theirs = [c for c in card.claims if c.uid != me]
    ours = [c for c in card.claims if c.uid == me]
    full += [c.words() for c in theirs]
    short += [f"{printable(c.user)}: {printable(c.name or c.job)}" for c in theirs[:1]]
    if ours:
        full.append("yours: " + ", ".join(f"job {printable(c.job)} {printable(c.name)}" for c in ours))
        short.append(f"yours: {printable(ours[0].name or ours[0].job)}")
    r = card.reservation
    if r is not None:
        note = f': "{printable(r.note)}"' if r.note else ""
        who = "you" if r.uid == me else printable(r.user)
        full.append(f"reserved by {who} until {format_time(r.until)}{note}")
        short.append(("yours" if r.uid == me else f"{who}'s") + f" →{format_time(r.until)}")
    return "; ".join(full), " · ".join(short[:2])


@dataclass(frozen=True)
class UseWithoutClaim:
    """A process on a card another user claims or reserved, which is not that user's: CUDA work
    started outside gpumon (advisory: shown, never stopped). Only what happened, never more."""

    gpu: int
    uuid: str | None
    pid: int
    user: str | None
    command: str | None
    holder: str  # whose claim or reservation the card is under
    kind: str  # "claim" or "reservation"
    job: str | None = None  # the claim's job
    until: float | None = None  # the reservation's end

    def on(self) -> str:
        """'claimed by bob (job 3f2a)', 'reserved by bob until Tue 18:00'."""
        if self.kind == "claim":
            return f"claimed by {printable(self.holder)}" + (f" (job {printable(self.job)})" if self.job else "")
        return f"reserved by {printable(self.holder)}" + (f" until {format_time(self.until)}" if self.until else "")

    def words(self) -> str:
        """"alice's python (pid 4242) on GPU 3, reserved by bob until Tue 18:00"."""
        program = printable((self.command or "?").split()[0].rsplit("/", 1)[-1])[:40] if self.command else "process"
        return f"{printable(self.user or '?')}'s {program} (pid {self.pid}) on GPU {self.gpu}, {self.on()}"

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "uuid": self.uuid, "pid": self.pid, "user": self.user,
                "on": {"kind": self.kind, "user": self.holder, "job": self.job, "until": self.until}}


def uses_without_claim(snapshot: Snapshot, shares: dict[str, CardSharing]) -> list[UseWithoutClaim]:
    """Every compute process on a card claimed or reserved by another user than its own (by uid
    where both are known, else by name)."""
    found = []
    for gpu in snapshot.gpus:
        card = of(gpu, shares)
        holders = [(c.uid, c.user, "claim", c.job, None) for c in card.claims]
        if card.reservation is not None:
            r = card.reservation
            holders.append((r.uid, r.user, "reservation", None, r.until))
        if not holders:
            continue
        for p in gpu.processes:
            if p.type == "graphics" or (p.uid is None and not p.user):
                continue
            if any((p.uid == uid) if p.uid is not None else (p.user == user) for uid, user, *_ in holders):
                continue
            _, user, kind, job, until = holders[0]
            found.append(UseWithoutClaim(gpu.index, gpu.uuid, p.pid, p.user, p.command, user, kind, job, until))
    return found


def _refs(gpu: GpuSample | dict[str, Any]) -> list[str]:
    if isinstance(gpu, dict):
        return [r for r in (gpu.get("uuid"), gpu.get("pci_bus_id")) if r]
    return [r for r in (gpu.uuid, gpu.pci_bus_id) if r]


def per_card(directory: Path, snapshot: Snapshot | None = None, idle_release: float = reservations.IDLE_RELEASE_S,
             ended: list[Ended] | None = None) -> dict[str, CardSharing]:
    """ref -> CardSharing for every card someone claims or reserves; {} when the place is missing
    or unreadable (nothing is shared there)."""
    if not directory.is_dir():
        return {}
    try:
        held = claims.read(directory)
        booked = reservations.read(directory, snapshot, idle_release, ended=ended)
    except OSError:
        return {}
    return {ref: CardSharing(held.get(ref, []), booked.get(ref)) for ref in set(held) | set(booked)}


def of(gpu: GpuSample | dict[str, Any], shares: dict[str, CardSharing]) -> CardSharing:
    """A card's sharing (a MIG slice's claims count as its card's)."""
    found = CardSharing()
    for ref in _refs(gpu):
        if ref in shares:
            found = shares[ref]
            break
    mig = gpu.get("mig_devices") or [] if isinstance(gpu, dict) else [m.uuid for m in gpu.mig_devices]
    extra = [c for m in mig if isinstance(m, str) and m in shares for c in shares[m].claims]
    return CardSharing(found.claims + extra, found.reservation) if extra else found


def annotate(document: dict[str, Any], shares: dict[str, CardSharing]) -> dict[str, Any]:
    """Add each card's `claims` (a list) and `reservation` (or null) to a snapshot document."""
    for gpu in document.get("gpus", []):
        mine = of(gpu, shares)
        gpu["claims"] = [c.to_dict() for c in mine.claims]
        gpu["reservation"] = mine.reservation.to_dict() if mine.reservation else None
    return document


@dataclass(frozen=True)
class HostSharing:
    """This host's claims and reservations by card, and its queue: what the views show."""

    cards: dict[str, CardSharing] = field(default_factory=dict)
    queue: list[queue_mod.Entry] = field(default_factory=list)


def host_sharing(sharing: SharingSettings, snapshot: Snapshot | None = None,
                 ended: list[Ended] | None = None) -> HostSharing:
    """Read this host's place (`[claims] dir`) once: every view of one sample uses the result."""
    directory = sharing.directory
    if not directory.is_dir():
        return HostSharing()
    try:
        line = queue_mod.read(directory)
    except OSError:
        line = []
    return HostSharing(per_card(directory, snapshot, sharing.idle_release_s, ended), line)


class SharingNow:
    """The latest reading of this host's place, for what repaints or publishes every sample (the
    TUI's cards, users view and J, `snapshot --stream`, the web page): read again at most every
    `every` seconds, in a thread of its own, so that a place another user filled (100,000 files
    take a while to list) never holds a frame, a sample or a page up. Looking up costs nothing."""

    def __init__(self, sharing: SharingSettings, every: float = 2.0) -> None:
        self.sharing = sharing
        self.every = every
        self.read_at = float("-inf")
        self.latest = HostSharing()
        self._reading: threading.Thread | None = None

    def refresh(self, snapshot: Snapshot | None = None) -> None:
        """Read again in the background, when due and not already reading."""
        if time.monotonic() - self.read_at < self.every or (self._reading is not None and self._reading.is_alive()):
            return
        self.read_at = time.monotonic()
        self._reading = threading.Thread(target=self.read, args=(snapshot,), name="gpumon-sharing", daemon=True)
        self._reading.start()

    def current(self, snapshot: Snapshot | None = None) -> HostSharing:
        """What was last read, the first time read now (a first answer must not say 'nobody')."""
        if self.read_at == float("-inf"):
            return self.read(snapshot)
        self.refresh(snapshot)
        return self.latest

    def read(self, snapshot: Snapshot | None = None) -> HostSharing:
        self.read_at = time.monotonic()
        self.latest = host_sharing(self.sharing, snapshot)  # one assignment: a reader sees old or new
        return self.latest

    def of(self, gpu: GpuSample) -> Reservation | None:
        return of(gpu, self.latest.cards).reservation

    def card(self, gpu: GpuSample) -> CardSharing:
        return of(gpu, self.latest.cards)

    def without_claim(self, snapshot: Snapshot) -> list[UseWithoutClaim]:
        return uses_without_claim(snapshot, self.latest.cards)

    def reservations(self) -> dict[str, Reservation]:
        return {ref: c.reservation for ref, c in self.latest.cards.items() if c.reservation is not None}


def reservations_now(sharing: SharingSettings, snapshot: Snapshot | None = None) -> dict[str, Reservation]:
    """This host's reservations in force (none where the place is missing or unreadable)."""
    directory = sharing.directory
    try:
        return reservations.read(directory, snapshot, sharing.idle_release_s) if directory.is_dir() else {}
    except OSError:
        return {}


def reservations_text(found: dict[str, Reservation]) -> list[str]:
    """'GPU 2 reserved by alice until 14:00: "paper"', a line per reserved card (their text made printable)."""
    ordered = sorted({id(r): r for r in found.values()}.values(),
                     key=lambda r: (r.index if r.index is not None else 1 << 30, r.card))
    return [f"GPU {r.index if r.index is not None else printable(r.card)} {r.words()}" for r in ordered]


class ReservationFollower:
    """For `watch`: the reservations of this host that ended since the last call, once each (those
    over before it started are not news), as events for the hooks."""

    def __init__(self, host: str, sharing: SharingSettings) -> None:
        self.host = host
        self.sharing = sharing
        self.seen: dict[str, float] = {}  # when each reservation was last seen in use, by file name
        self.told: set[str] = set()
        self.started = False
        self.every = 2.0
        self.read_at = float("-inf")

    def read_new(self, snapshot: Snapshot | None) -> list[ReservationEvent]:
        if time.monotonic() - self.read_at < self.every:  # read again every few seconds, not every sample
            return []
        self.read_at = time.monotonic()
        directory = self.sharing.directory
        ended: list[Ended] = []
        if directory.is_dir():
            try:
                reservations.read(directory, snapshot, self.sharing.idle_release_s, ended=ended, seen=self.seen)
            except OSError:
                return []
        new = [e for e in ended if e.reservation.path.name not in self.told]
        self.told |= {e.reservation.path.name for e in new}
        if not self.started:
            self.started = True
            return []
        return [ReservationEvent(host=self.host, gpu=e.reservation.index, uuid=e.reservation.card,
                                 user=e.reservation.user, note=e.reservation.note, until=e.reservation.until,
                                 reason="its time was up" if e.why == "expired"
                                 else f"unused for {format_duration(e.reservation.idle_release)}", time=time.time())
                for e in new]
