"""A launch's and a supervisor's side of sharing the host (gpumon/sharing): the cards others
hold, claiming the chosen ones in the same step as choosing them, the queue's turn.

A launch (`gpumon run`, the TUI through it) chooses and claims under the place's lock, then hands
its claim (and queue entry) descriptors to the job's supervisor, which holds them until the job
ends. A place that cannot be used costs one line and changes nothing else: jobs launch as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.model import GpuSample
from gpumon.sharing import claims, queue, reservations
from gpumon.sharing.folder import IDLE_RELEASE_S, HeldRecords, SharingSettings, Unavailable, exclusive


@dataclass(frozen=True)
class CardsTaken:
    """What placement must know of the others: cards not to choose (ref -> why, in words) and the
    user's own reserved cards (preferred)."""

    skip: dict[str, str] = field(default_factory=dict)
    mine: frozenset[str] = frozenset()
    claimed: dict[str, list[claims.Claim]] = field(default_factory=dict)


def cards_taken_now(directory: Path, idle_release: float = IDLE_RELEASE_S) -> CardsTaken:
    held = claims.read(directory)
    booked = reservations.read(directory, idle_release=idle_release)
    skip = {card: ", ".join(c.words() for c in listed) for card, listed in held.items()}
    for card, r in booked.items():
        if not r.mine:
            skip[card] = (skip[card] + "; " if card in skip else "") + r.words()
    return CardsTaken(skip, frozenset(card for card, r in booked.items() if r.mine), held)


def notes_for(gpus: Sequence[GpuSample], taken: CardsTaken) -> list[str]:
    """For cards named by hand: 'GPU 1 is claimed by alice: job 3f2a train.py, since 10:02'."""
    return [f"GPU {g.index} is {taken.skip[g.ref]}" for g in gpus if g.ref in taken.skip]


class LaunchSharing:
    """The place as one launch or one supervisor uses it; says once why it cannot."""

    def __init__(self, settings: SharingSettings, warn: Callable[[str], None]) -> None:
        self.settings = settings
        self.directory = settings.directory
        self.warn = warn
        self.warned = False

    def unavailable(self, exc: Unavailable) -> None:
        if not self.warned:
            self.warned = True
            self.warn(f"claims: {exc}; cards are chosen without them")

    @contextmanager
    def placing(self) -> Iterator[Path | None]:
        """The place, locked for choosing and claiming; None (said once) when it cannot be used."""
        lock = exclusive(self.directory)
        try:
            lock.__enter__()
        except Unavailable as exc:
            self.unavailable(exc)
            yield None
            return
        try:
            yield self.directory
        finally:
            lock.__exit__(None, None, None)

    def taken(self, place: Path | None) -> CardsTaken:
        if place is None:
            return CardsTaken()
        try:
            return cards_taken_now(place, self.settings.idle_release_s)
        except (OSError, Unavailable) as exc:
            self.unavailable(Unavailable(str(exc)))
            return CardsTaken()

    def peek(self) -> CardsTaken:
        """What others hold now, without the lock (select: it claims nothing)."""
        if not self.directory.exists():
            return CardsTaken()
        try:
            return cards_taken_now(self.directory, self.settings.idle_release_s)
        except OSError as exc:
            self.unavailable(Unavailable(f"cannot read {self.directory}: {exc.strerror}"))
            return CardsTaken()

    def claim(self, place: Path | None, refs: Sequence[str], job: str, name: str) -> HeldRecords:
        if place is None or not refs:
            return HeldRecords([])
        try:
            return claims.claim(place, list(refs), job, name)
        except Unavailable as exc:
            self.unavailable(exc)
            return HeldRecords([])

    def enqueue(self, place: Path | None, job: str, name: str, gpu_spec: str) -> HeldRecords:
        if place is None:
            return HeldRecords([])
        try:
            return queue.enqueue(place, job, name, gpu_spec)
        except Unavailable as exc:
            self.unavailable(exc)
            return HeldRecords([])


class SupervisorSharing:
    """A supervisor's claims and queue entry: adopted from its launcher (or made, for a supervisor
    systemd started, which inherits no descriptors), given up when the job ends."""

    def __init__(self, settings: SharingSettings, job: str, name: str, gpu_spec: str,
                 warn: Callable[[str], None]) -> None:
        self.sharing = LaunchSharing(settings, warn)
        self.job, self.name, self.gpu_spec = job, name, gpu_spec
        self.claims = claims.adopt(self.sharing.directory, job)
        self.entry = queue.adopt(self.sharing.directory, job)
        self.waiting_for = ""  # why a queued job has not started yet, in words
        self.noted_at = float("-inf")

    def hold(self, gpus: Sequence[GpuSample]) -> None:
        """The cards chosen at launch: claimed by the launcher, or else now."""
        if not self.claims and gpus:
            with self.sharing.placing() as place:
                self.claims = self.sharing.claim(place, [g.ref for g in gpus], self.job, self.name)

    def try_start(self, pick: Callable[[CardsTaken], list[GpuSample] | None],
                  queued: bool = True) -> list[GpuSample] | None:
        """`pick(taken)` -> cards, or None while they are not ready; asked only on the queue's
        turn (when `queued`). Cards picked are claimed before the lock is let go."""
        with self.sharing.placing() as place:
            if place is not None and queued:
                if not self.entry:
                    self.entry = self.sharing.enqueue(place, self.job, self.name, self.gpu_spec)
                ahead = self._ahead(place)
                if ahead:
                    self.waiting_for = f"{ahead} job{'s' if ahead > 1 else ''} ahead in the host's queue"
                    return None
            gpus = pick(self.sharing.taken(place))
            if gpus:
                self.claims = self.sharing.claim(place, [g.ref for g in gpus], self.job, self.name)
                self.entry.release()
            return gpus

    def _ahead(self, place: Path) -> int:
        mine = {os.path.realpath(p) for p in self.entry.paths}
        try:
            line = queue.read(place)
        except OSError:
            return 0
        for entry in line:
            if os.path.realpath(entry.path) in mine:
                return entry.position - 1
        return 0

    def note_use(self, gpus: Sequence[GpuSample]) -> None:
        """The job runs on `gpus`: our reservations of them are in use (at most once a minute)."""
        now = time.monotonic()
        if now - self.noted_at < reservations.TOUCH_EVERY_S or not self.sharing.directory.is_dir():
            return
        self.noted_at = now
        try:
            reservations.note_use(self.sharing.directory, {g.ref for g in gpus})
        except OSError:
            pass

    def release_cards(self) -> None:
        self.claims.release()

    def release_all(self) -> None:
        self.claims.release()
        self.entry.release()
