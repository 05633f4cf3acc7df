"""Sampling every card through NVML, each card on its own lane, so a slow card delays only itself.

A sample asks every card that is not still busy with the previous question, waits for the answers
up to a deadline, and reports each card as it stands: fresh values, or (still no answer after
STALE_AFTER_S) its last values marked "stale" with their age. Cards are opened on their lanes
too, so a card that hangs while opening holds up nothing else. A lost card is asked again for a
new handle every few seconds (it comes back after a reset under its UUID); when the whole driver
is gone (unloaded or reloaded), NVML is initialised again with backoff.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import pynvml

from gpumon.cards.backends.base import Machine, PerCardBackend
from gpumon.cards.backends.lanes import STALE_AFTER_S, Lanes, not_responding, settle
from gpumon.cards.backends.nvml import topology as links
from gpumon.cards.backends.nvml.counters import read_counters
from gpumon.cards.backends.nvml.events import EVENT_NAMES, RECOVERY, XID, XidEvents
from gpumon.cards.backends.nvml.library import (
    Card,
    CardLost,
    DriverGone,
    decode,
    init_error,
    load_library,
    versioned_calls,
)
from gpumon.cards.backends.nvml.opening import PROBE_LOST_S, open_card, probe, read_slow_state
from gpumon.cards.backends.nvml.values import card_values
from gpumon.cards.backends.pci import device_of, pci_path
from gpumon.errors import NoDriverError
from gpumon.health.history import HealthTracker
from gpumon.health.rules import HealthSettings
from gpumon.model import GpuSample, Snapshot, Topology

log = logging.getLogger(__name__)
DEFAULT_WAIT_S = 2.0  # how long sample() waits for slow cards when the caller does not say
REINIT_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 15.0, 30.0)
STAGGER_S = 0.02


class NvmlBackend(PerCardBackend):
    name = "nvml"
    xid_events = True

    def __init__(self, lib_path: str | None = None, health: HealthSettings = HealthSettings()) -> None:
        lib_path = lib_path or os.environ.get("GPUMON_NVML_LIB") or None
        if lib_path:
            load_library(lib_path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise init_error(exc) from None
        self.host = socket.gethostname()
        self._versions = versioned_calls()
        self._versions_lock = threading.Lock()
        self._lanes = Lanes()
        self.generation = 0  # bumped each time NVML is initialised again
        self.driver_gone: str | None = None  # why, while NVML must be initialised again
        self._reinit_at = 0.0
        self._reinit_tries = 0
        self._topology: Topology | None = None
        self.cards: list[Card] = []
        self.health = HealthTracker(health)  # each card's verdict, drawn on its lane once per sample
        self._start()
        self._xid = XidEvents(lambda: self.cards)

    @classmethod
    def open_here(cls, machine: Machine, first_index: int = 0) -> NvmlBackend:
        # NVML numbers the cards itself: NVIDIA's come first on a machine that has other vendors' too.
        return cls(lib_path=machine.nvml_lib, health=machine.health)

    def index_count(self) -> int:
        return len(self.cards)

    def health_baseline(self) -> HealthTracker:
        return self.health

    def pci_paths(self, sysfs: str) -> dict[int, Sequence[str]]:
        return {c.index: pci_path(device_of(sysfs, c.pci_bus_id)) for c in self.cards if c.pci_bus_id}

    def _start(self) -> None:
        """Versions and the card list (cards are opened on their lanes)."""
        self.driver_version = self._system(pynvml.nvmlSystemGetDriverVersion)
        cuda = self._system(pynvml.nvmlSystemGetCudaDriverVersion)
        self.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise NoDriverError(f"the NVIDIA driver cannot list its cards (nvmlDeviceGetCount: {exc})") from None
        self.cards = [Card(i, self._versions, self._versions_lock) for i in range(count)]

    def _system(self, fn: Callable[[], Any]) -> Any:
        try:
            return decode(value) if isinstance(value := fn(), (str, bytes)) else value
        except pynvml.NVMLError:
            return None

    def identity(self, wait_s: float) -> Snapshot:
        """The cards' names and ids, without their values: what a first frame needs. Each card is
        opened on its lane (the first sample then finds it open); a card that has not answered
        within `wait_s` is listed without a name ("?") and state "stale"."""
        deadline = time.monotonic() + wait_s
        opening = [(card, self._lanes.submit(card.index, partial(self._open_only, card)))
                   for card in self.cards if not card.opened]
        for _, future in opening:
            settle(future, deadline - time.monotonic())
        waiting = {card.index for card, future in opening if not future.done()}
        gpus = tuple(self._identity(card, state="stale" if card.index in waiting else card.state,
                                    error=card.error) for card in self.cards)
        return Snapshot(time=time.time(), host=self.host, backend=self.name, driver_version=self.driver_version,
                        cuda_driver_version=self.cuda_driver_version, gpus=gpus)

    def _open_only(self, card: Card) -> None:
        if not card.opened:
            try:
                open_card(card)
            except DriverGone:  # the first sample finds out and says so
                card.opened = False

    # -- sampling --

    def sample(self, wait_s: float | None = None) -> Snapshot:
        """Every card, waiting up to `wait_s` (default DEFAULT_WAIT_S) for cards still answering."""
        if self.driver_gone is not None:
            self._reinit()
        cards, generation = self.cards, self.generation
        if self.driver_gone is None:
            deadline = time.monotonic() + (DEFAULT_WAIT_S if wait_s is None else wait_s)
            for card in cards:
                if card.pending is None:
                    card.asked_at = time.monotonic()
                    card.pending = self._lanes.submit(card.index, partial(self._read_card, card, generation))
                    # Healthy cards answer in well under a millisecond: read one after another, they
                    # never contend for the GIL; a slow one holds up the next by STAGGER_S at most.
                    settle(card.pending, min(STAGGER_S, deadline - time.monotonic()))
            for card in cards:
                settle(card.pending, deadline - time.monotonic())
        gpus = tuple(self._answer(card) for card in cards)
        return Snapshot(time=time.time(), host=self.host, backend=self.name, driver_version=self.driver_version,
                        cuda_driver_version=self.cuda_driver_version, gpus=gpus)

    def _answer(self, card: Card) -> GpuSample:
        """The card as it stands now: its new answer, its recent one, or its last one marked stale."""
        if self.driver_gone is not None:
            wait = max(0.0, self._reinit_at - time.monotonic())
            return self._identity(card, state="error",
                                  error=f"NVIDIA driver gone ({self.driver_gone}); trying again in {wait:.0f} s")
        now = time.monotonic()
        future = card.pending
        if future is not None and future.done():
            card.pending = None
            try:
                card.last = future.result()
            except Exception as exc:  # a bug or a driver answering nonsense: this card only
                log.warning("NVML: card %d: %s", card.index, exc)
                card.last = self._identity(card, state="error", error=f"{type(exc).__name__}: {exc}")
            card.answered_at = now
            return card.last
        since = card.answered_at if card.answered_at is not None else card.asked_at
        if card.last is not None and now - since < STALE_AFTER_S:
            return card.last  # a little late: nothing to report yet
        stale_s = round(now - since, 1)
        error = not_responding(stale_s)
        if card.last is None:
            return self._identity(card, state="stale", stale_s=stale_s, error=error)
        return dataclasses.replace(card.last, state="stale", stale_s=stale_s, error=error)

    def _read_card(self, card: Card, generation: int) -> GpuSample:
        """One card's sample; runs on its lane."""
        try:
            if not card.opened:
                open_card(card)
            elif card.handle is None or card.state == "lost":
                probe(card)
            return self._sample_card(card)
        except DriverGone as exc:
            if generation == self.generation and self.driver_gone is None:
                self._lost_driver(str(exc))
            return self._identity(card, state="error", error=f"NVIDIA driver gone ({exc})")

    def _sample_card(self, card: Card) -> GpuSample:
        if card.handle is None or card.state == "lost":
            return self._identity(card, state=card.state, error=card.error, health=self._verdict(card, card.state))
        card.state, card.error = "ok", None
        try:
            read_slow_state(card)
            values = card_values(card)
            raw = read_counters(card, self.health.settings.interval_s)
        except CardLost as exc:
            card.state, card.error = "lost", str(exc)
            card.probe_at = time.monotonic() + PROBE_LOST_S
            return self._identity(card, state="lost", error=card.error, health=self._verdict(card, "lost"))
        counters, verdict = self.health.card(card.uuid or f"index:{card.index}", card.state, time.time(), raw,
                                             card.fabric, values["ecc_errors_uncorrected"])
        return self._identity(card, state=card.state, error=card.error, counters=counters, health=verdict, **values)

    def _verdict(self, card: Card, state: str) -> Any:
        """The verdict of a card that cannot be read: a lost one fails; otherwise unknown (None)."""
        if state != "lost":
            return None
        return self.health.card(card.uuid or f"index:{card.index}", state, time.time())[1]

    def _identity(self, card: Card, **values: Any) -> GpuSample:
        return GpuSample(index=card.index, uuid=card.uuid, name=card.name, pci_bus_id=card.pci_bus_id,
                         minor_number=card.minor_number, numa_node=card.numa_node,
                         cpu_affinity=card.cpu_affinity, mig_mode=card.mig_mode,
                         fabric=card.fabric, compute_mode=card.compute_mode, **values)

    # -- the driver going away and coming back --

    def _lost_driver(self, reason: str) -> None:
        log.warning("NVML: the driver is gone (%s); initialising again with backoff", reason)
        self.driver_gone = reason
        self._reinit_tries = 0
        self._reinit_at = time.monotonic() + REINIT_BACKOFF_S[0]

    def _reinit(self) -> None:
        now = time.monotonic()
        if now < self._reinit_at:
            return
        try:
            pynvml.nvmlShutdown()  # the old session, if the library still has one
        except pynvml.NVMLError:
            pass
        try:
            pynvml.nvmlInit()
            self._start()
        except (pynvml.NVMLError, NoDriverError) as exc:
            self._reinit_tries += 1
            self._reinit_at = now + REINIT_BACKOFF_S[min(self._reinit_tries, len(REINIT_BACKOFF_S) - 1)]
            self.driver_gone = str(exc)
            return
        log.warning("NVML: initialised again; %d cards", len(self.cards))
        self.generation += 1
        self.driver_gone = None
        self._topology = None
        self._xid.reset()

    # -- XID events and topology --

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        """Block up to `timeout_s` for XID errors; (card index, XID) pairs. Call from one thread.
        Each one, and each of the driver's other health events (a poison, a DRAM retirement, …),
        counts towards its card's verdict from the next sample on; a recovery action event has the
        card's counters read again at its next sample."""
        xids = []
        cards = self.cards
        for index, kind, data in self._xid.wait(timeout_s):
            if not 0 <= index < len(cards):
                continue
            card, now = cards[index], time.time()
            key = card.uuid or f"index:{index}"
            if kind == XID:
                self.health.note_xid(key, data, now)
                xids.append((index, data))
                continue
            if kind == RECOVERY:
                card.counters_read_at = float("-inf")
            self.health.note_event(key, EVENT_NAMES[kind], data, now)
        return xids

    def topology(self, wait_s: float | None = None,
                 on_progress: Callable[[Topology], None] | None = None) -> Topology:
        """The link matrix of the cards that answer within `wait_s`; the others are left out, with
        why. `on_progress` gets the matrix so far each time a card's row arrives."""
        if self._topology is not None:
            return self._topology
        deadline = time.monotonic() + (DEFAULT_WAIT_S if wait_s is None else wait_s)
        topo = links.read_links(self.cards, self._lanes, deadline, on_progress)
        if not topo.left_out and len(topo.indices) == len(self.cards):  # links never change: read once
            self._topology = topo
        return topo

    def close(self) -> None:
        self._xid.close(timeout_s=1.0)  # an XID listener's wait ends first: shutdown frees its event set
        # nvmlShutdown may wait for a hung call: give it a moment, never more.
        closing = threading.Thread(target=_shutdown, name="gpumon-nvml-shutdown", daemon=True)
        closing.start()
        closing.join(1.0)


def _shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass
