"""A launch's and a supervisor's side of sharing the host (gpumon/sharing): the cards others
hold, claiming the chosen ones, the queue's turn.

There is no lock on the place (any user could hold it). A launch chooses among the cards nobody
claims, claims them, and reads the claims again: a claim on the same card that it did not see
before choosing is a rival launch's, so it withdraws and chooses again after a short random wait.
Of two launches that chose one card, the later to read sees the other's claim, so two never both
keep it (both may withdraw; one then wins the retry). A launch that cannot be sure for PLACING_S
refuses auto placement with one line; a card the user named goes on (told who else holds it).
A launch then hands its claim (and queue entry) descriptors to the job's supervisor, which holds
them until the job ends and makes a claim again if someone removes it.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, TypeVar

from gpumon.errors import UsageError
from gpumon.jobs.placement import auto_count, could_use
from gpumon.model import GpuSample
from gpumon.sanitize import printable
from gpumon.sharing import claims, queue, reservations
from gpumon.sharing.folder import IDLE_RELEASE_S, SharingSettings, Unavailable, check_folder, ensure
from gpumon.sharing.records import HeldRecords
from gpumon.units import parse_size

PLACING_S = 3.0  # how long a launch tries to keep free cards while other launches take the same ones


@dataclass(frozen=True)
class CardsTaken:
    """What placement must know of the others: cards not to choose (ref -> why, in words) and the
    user's own reserved cards (preferred)."""

    skip: dict[str, str] = field(default_factory=dict)
    mine: frozenset[str] = frozenset()
    claimed: dict[str, list[claims.Claim]] = field(default_factory=dict)
    reserved: dict[str, str] = field(default_factory=dict)  # others' reservations, in words

    def others_on(self, ref: str) -> str:
        """Who else claims or reserved the card, in words ('' when nobody, or only the user)."""
        theirs = [c.words() for c in self.claimed.get(ref, []) if c.uid != os.geteuid()]
        return "; ".join([*theirs, *([self.reserved[ref]] if ref in self.reserved else [])])


def cards_taken_now(directory: Path, idle_release: float = IDLE_RELEASE_S) -> CardsTaken:
    held = claims.read(directory)
    booked = reservations.read(directory, idle_release=idle_release)
    skip = {card: ", ".join(c.words() for c in listed) for card, listed in held.items()}
    reserved = {card: r.words() for card, r in booked.items() if not r.mine}
    for card, words in reserved.items():
        skip[card] = (skip[card] + "; " if card in skip else "") + words
    return CardsTaken(skip, frozenset(card for card, r in booked.items() if r.mine), held, reserved)


def notes_for(gpus: Sequence[GpuSample], taken: CardsTaken) -> list[str]:
    """For cards named by hand: 'GPU 1 is claimed by alice: job 3f2a train.py, since 10:02'."""
    return [f"GPU {g.index} is {taken.skip[g.ref]}" for g in gpus if g.ref in taken.skip]


class Chosen(Protocol):
    """What a launch chose: its cards' references, for its job (a JobSpec is one)."""

    gpus: list[str]
    id: str
    name: str


C = TypeVar("C", bound=Chosen)


class LaunchSharing:
    """The place as one launch or one supervisor uses it; says once why it cannot, or why it is
    shared badly (its owner can remove others' records)."""

    def __init__(self, settings: SharingSettings, warn: Callable[[str], None]) -> None:
        self.settings = settings
        self.directory = settings.directory
        self.warn = warn
        self.warned = False

    def _say(self, line: str) -> None:
        if not self.warned:
            self.warned = True
            self.warn(line)

    def usable(self, say: bool = True) -> str | None:
        """None when records can be kept in the place (made if missing); else why not (said once,
        with `say`)."""
        try:
            ensure(self.directory)
        except Unavailable as exc:
            if say:
                self._say(f"claims: {exc}")
            return str(exc)
        if note := self.shared_badly():
            self._say(note)
        return None

    def shared_badly(self) -> str:
        """'claims: /tmp/gpumon-claims belongs to alice, who can remove anyone's claims…; to fix: …',
        or '' where the place is set up as it should be."""
        check = check_folder(self.directory)
        return f"claims: {check.why}; to fix: {check.fix}" if check.shared_badly else ""

    def taken_now(self) -> CardsTaken:
        """What others hold now (select, the TUI's question before `r`: nothing is claimed)."""
        if not self.directory.is_dir():
            return CardsTaken()
        try:
            return cards_taken_now(self.directory, self.settings.idle_release_s)
        except OSError as exc:
            self._say(f"claims: cannot read {self.directory}: {exc.strerror}")
            return CardsTaken()

    def claim_chosen(self, choose: Callable[[CardsTaken], C], auto: bool,
                     queued: bool = False) -> tuple[C, CardsTaken, HeldRecords]:
        """`choose(taken)` -> the launch's cards, claimed before this returns. `auto`: chosen by
        gpumon, so only where no one else claims or reserves them (UsageError, one line, when that
        cannot be made sure); else named by the user: claimed as asked (shared, if others hold it).
        `queued`: the job will join the queue, which needs the place (UsageError without it)."""
        why = self.usable(say=not (auto or queued))
        if why is not None:
            if queued:
                raise UsageError(f"claims: {why}: the host's queue cannot be joined")
            if auto:
                raise UsageError(f"claims: {why}: cards cannot be chosen safely, so --gpu auto is refused "
                                 "(name a card, --gpu N, to start there anyway)")
            return choose(CardsTaken()), CardsTaken(), HeldRecords([])
        give_up = time.monotonic() + PLACING_S
        while True:
            taken = self.taken_now()
            chosen = choose(taken)
            hold = self.claim(chosen.gpus, chosen.id, chosen.name)
            rivals = self.rivals(chosen.gpus, chosen.id, taken) if auto else []
            if not rivals:
                return chosen, taken, hold
            hold.release()
            if time.monotonic() >= give_up:
                raise UsageError(f"claims: other launches kept taking the same cards for {PLACING_S:g} s "
                                 f"({rivals[0]}); try again")
            time.sleep(random.uniform(0.02, 0.2))

    def claim(self, refs: Sequence[str], job: str, name: str) -> HeldRecords:
        if not refs:
            return HeldRecords([])
        try:
            return claims.claim(self.directory, list(refs), job, name)
        except Unavailable as exc:
            raise UsageError(f"claims: {exc}") from None

    def rivals(self, refs: Sequence[str], job: str, seen: CardsTaken) -> list[str]:
        """Others' claims of `refs` (a card chosen for `job`, which nobody claimed when `seen` was
        read) and reservations of them made since then, in words."""
        now = cards_taken_now(self.directory, self.settings.idle_release_s)
        found = []
        for ref in refs:
            found += [f"{printable(ref)} {c.words()}" for c in now.claimed.get(ref, []) if c.job != job]
            if ref in now.skip and not now.claimed.get(ref) and ref not in seen.skip:
                found.append(f"{printable(ref)} {now.skip[ref]}")
        return found

    def enqueue(self, job: str, name: str, gpu_spec: str, count: int, cards: Sequence[str],
                min_free: int | None) -> HeldRecords:
        why = self.usable(say=False)
        if why is not None:
            raise UsageError(f"claims: {why}: the host's queue cannot be joined")
        try:
            return queue.enqueue(self.directory, job, name, gpu_spec, count, cards, min_free)
        except Unavailable as exc:
            raise UsageError(f"claims: {exc}: the host's queue cannot be joined") from None


def queue_request(gpu_spec: str, min_free: str | None, named: Sequence[str] = ()) -> tuple[int, list[str], int | None]:
    """What a queue entry says its job asks for: how many cards, which (`named`: their UUIDs; none
    for auto), and the free memory each needs in bytes (None: none, or a share of each card)."""
    count = auto_count(gpu_spec) or max(1, len(named))
    need = parse_size(min_free, None) if min_free and not min_free.endswith("%") else None
    return count, list(named), need


class SupervisorSharing:
    """A supervisor's claims and queue entry: adopted from its launcher (or made, for a supervisor
    systemd started, which inherits no descriptors), kept while the job runs, given up when it ends."""

    def __init__(self, settings: SharingSettings, job: str, name: str, gpu_spec: str,
                 warn: Callable[[str], None], min_free: str | None = None) -> None:
        self.sharing = LaunchSharing(settings, warn)
        self.job, self.name, self.gpu_spec, self.min_free = job, name, gpu_spec, min_free
        self.claims = claims.adopt(self.sharing.directory, job)
        self.entry = queue.adopt(self.sharing.directory, job)
        self.waiting_for = ""  # why a queued job has not started yet, in words
        self.noted_at = float("-inf")

    def hold(self, gpus: Sequence[GpuSample]) -> None:
        """The cards chosen at launch: claimed by the launcher, or else now (named: as they are)."""
        if not self.claims and gpus and self.sharing.usable() is None:
            self.claims = self.sharing.claim([g.ref for g in gpus], self.job, self.name)

    def try_start(self, pick: Callable[[CardsTaken], list[GpuSample] | None], gpus: Sequence[GpuSample] = (),
                  queued: bool = True) -> list[GpuSample] | None:
        """`pick(taken)` -> cards, or None while they are not ready; with `queued`, the cards a job
        ahead in the host's queue could use are taken too (it must never be delayed). Cards picked
        are claimed, and kept unless a rival launch claimed one at the same moment."""
        if why := self.sharing.usable():
            self.waiting_for = f"the host's claims cannot be used: {why}"
            return None
        taken = self.sharing.taken_now()
        if queued:
            if not self.entry:
                self.entry = self.sharing.enqueue(self.job, self.name, self.gpu_spec,
                                                  *queue_request(self.gpu_spec, self.min_free))
            taken = self._behind(taken, gpus)
        chosen = pick(taken)
        if not chosen:
            return None
        hold = self.sharing.claim([g.ref for g in chosen], self.job, self.name)
        if self.sharing.rivals([g.ref for g in chosen], self.job, taken):
            hold.release()
            return None
        self.claims = hold
        self.entry.release()
        return chosen

    def _behind(self, taken: CardsTaken, gpus: Sequence[GpuSample]) -> CardsTaken:
        """`taken`, with every card a job ahead of ours in the queue could ever use."""
        mine = {os.path.realpath(p) for p in self.entry.paths}
        try:
            line = queue.read(self.sharing.directory)
        except OSError:
            return taken
        ahead = []
        for entry in line:
            if os.path.realpath(entry.path) in mine:
                break
            ahead.append(entry)
        else:
            ahead = []  # ours is not in line (yet): nobody is ahead
        if not ahead:
            self.waiting_for = ""
            return taken
        kept = dict(taken.skip)
        for entry in ahead:
            for gpu in gpus:
                if gpu.ref and gpu.ref not in kept and could_use(gpu, entry.cards, entry.min_free):
                    kept[gpu.ref] = (f"kept for {printable(entry.user)}'s {printable(entry.gpu_spec)} "
                                     f"(job {printable(entry.job)}, {entry.position}. in the host's queue)")
        first = ahead[0]
        self.waiting_for = (f"behind {printable(first.user)}'s {printable(first.gpu_spec)} (job {printable(first.job)}"
                            f"{f' and {len(ahead) - 1} more' if len(ahead) > 1 else ''}): only cards "
                            f"{'they' if len(ahead) > 1 else 'it'} cannot use may start it sooner")
        return replace(taken, skip=kept)

    def keep_claims(self) -> None:
        """Make again any claim of ours someone removed (the folder's owner can): the job still
        runs on that card."""
        self.claims.make_again(self.sharing.directory)

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
