"""A minute of usage, added up in memory as samples come: per card per holder (the holders
owners/holders.py's HolderTracker worked out for the sample, with their share of each card) and per
card. When a sample falls in the next minute, the finished one is handed over whole (one
transaction in the ledger).

Time is counted by a monotonic clock between two samples (a step of the wall clock neither adds
nor takes away seconds); the wall clock only says which minute a sample belongs to. A gap longer
than LONGEST_GAP_S counts nothing (gpumon was not looking: suspended, or stopped), and the first
sample after a start counts nothing either, so a restarted watch never counts the time it was
away. A card is known by its UUID, so a card that is reset (lost, then back, maybe under another
index) goes on in the same rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from gpumon.model import Snapshot
from gpumon.owners.holders import HOLDER_KINDS, Holder

LONGEST_GAP_S = 60.0


# One holder on one card in one minute: a list in this order (the ledger's columns), since it is
# added to for every holder on every card each sample (a list costs 30 % less than attributes).
HOLDER_FIELDS = ("card_index", "label", "user",
                 "held_s",  # seconds held
                 "sm_s", "sm_known_s",  # SM % x seconds, over the seconds SM was known
                 "mem_s", "mem_peak",  # bytes x seconds; the most in one sample
                 "energy_j",  # its share of the card's power x seconds
                 "idle_s")  # held with every process of it at 0 % SM on this card
HELD, SM, SM_KNOWN, MEM, PEAK, ENERGY, IDLE = range(3, 10)


@dataclass(slots=True)
class CardMinute:
    card_index: int
    name: str
    seen_s: float = 0.0
    util_s: float = 0.0  # utilisation % x seconds, over util_known_s
    util_known_s: float = 0.0
    energy_j: float = 0.0
    held_s: float = 0.0  # some process held it
    busy_s: float = 0.0  # its utilisation above 0


@dataclass
class Minute:
    """What a ledger writes in one transaction: `holders` by (host, card, kind, id)."""

    start: int  # unix seconds, a multiple of the period
    holders: dict[tuple[str, str, str, str], list] = field(default_factory=dict)  # as HOLDER_FIELDS
    cards: dict[tuple[str, str], CardMinute] = field(default_factory=dict)


class MinuteBook:
    """Feed it each sample with its holders; `add` returns the minutes that are finished."""

    def __init__(self, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s = period_s
        self._clock = clock
        self._last: dict[str, float] = {}  # host -> monotonic time of its last sample
        self.current: Minute | None = None

    def add(self, snapshot: Snapshot, holders: Iterable[Holder], host: str | None = None) -> list[Minute]:
        host = host or snapshot.host
        now = self._clock()
        last = self._last.get(host)
        self._last[host] = now
        dt = now - last if last is not None else 0.0
        if not 0 < dt <= LONGEST_GAP_S:
            return []
        start = int(snapshot.time // self.period_s * self.period_s)
        done = []
        if self.current is not None and self.current.start != start:
            done.append(self.current)
            self.current = None
        if self.current is None:
            self.current = Minute(start)
        minute = self.current
        for gpu in snapshot.gpus:
            if gpu.state == "lost":
                continue
            key = (host, gpu.key)
            card = minute.cards.get(key)
            if card is None:
                card = minute.cards[key] = CardMinute(gpu.index, gpu.name)
            card.card_index = gpu.index
            card.seen_s += dt
            util = gpu.utilization_gpu
            if util is not None:
                card.util_s += util * dt
                card.util_known_s += dt
                if util > 0:
                    card.busy_s += dt
            if gpu.power_draw is not None:
                card.energy_j += gpu.power_draw * dt
            if gpu.processes or gpu.owner:
                card.held_s += dt
        rows = minute.holders
        for h in holders:
            kind, ident = h.kind, h.id
            if kind not in HOLDER_KINDS:
                continue
            for index, (uuid, memory, sm, power) in h.parts.items():
                key4 = (host, uuid or f"index:{index}", kind, ident)
                row = rows.get(key4)
                if row is None:
                    row = rows[key4] = [index, h.label, h.user, 0.0, 0.0, 0.0, 0.0, None, 0.0, 0.0]
                row[HELD] += dt
                if sm is not None:
                    row[SM] += sm * dt
                    row[SM_KNOWN] += dt
                    if not sm:
                        row[IDLE] += dt
                if memory is not None:
                    row[MEM] += memory * dt
                    peak = row[PEAK]
                    if peak is None or memory > peak:
                        row[PEAK] = memory
                if power is not None:
                    row[ENERGY] += power * dt
        return done

    def pause(self, host: str | None = None) -> None:
        """Count nothing for the time until the next sample (another process records meanwhile)."""
        if host is None:
            self._last.clear()
        else:
            self._last.pop(host, None)

    def take(self) -> Minute | None:
        """The minute so far (at exit): the ledger adds it to the same minute's rows of whoever goes on."""
        minute, self.current = self.current, None
        return minute
