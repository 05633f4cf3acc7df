"""XID errors and the driver's other health events, read from an NVML event set in their own
thread (watch and the TUI).

Besides XIDs, the events that say a card is going bad (EVENT_NAMES: a single-bit ECC storm, a
DRAM retirement and its failure, poison, the card unavailable, a recovery action), where the card
supports them: each card is asked which types it supports (nvmlDeviceGetSupportedEventTypes) and
registered for those only, since the driver refuses the whole registration for one type it lacks.

Cards are opened on their lanes, come back after a reset with new handles, and a driver reload
makes the event set worthless: each wait registers the cards that have a handle not registered yet,
and `reset()` (after NVML is initialised again) starts a new set.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpumon.cards.backends.nvml.library import DRIVER_GONE, Card

log = logging.getLogger(__name__)

XID = pynvml.nvmlEventTypeXidCriticalError
RECOVERY = getattr(pynvml, "nvmlEventTypeGpuRecoveryAction", 0x8000)
# The other event types that tell of a card going bad, by the names the health verdict knows them by
# (gpumon/health/driver_events.py); the values as nvml.h has them, for bindings that predate them.
EVENT_NAMES: dict[int, str] = {
    getattr(pynvml, "nvmlEventTypeSingleBitEccErrorStorm", 0x200): "sbe_storm",
    getattr(pynvml, "nvmlEventTypeDramRetirementEvent", 0x400): "dram_retirement",
    getattr(pynvml, "nvmlEventTypeDramRetirementFailure", 0x800): "dram_retirement_failure",
    getattr(pynvml, "nvmlEventTypeNonFatalPoisonError", 0x1000): "nonfatal_poison",
    getattr(pynvml, "nvmlEventTypeFatalPoisonError", 0x2000): "fatal_poison",
    getattr(pynvml, "nvmlEventTypeGpuUnavailableError", 0x4000): "gpu_unavailable",
    RECOVERY: "recovery_action",
}
WANTED = XID | sum(EVENT_NAMES)


class XidEvents:
    """Opened on first use; when the driver has no event support, waiting just sleeps."""

    def __init__(self, cards: Callable[[], list[Card]]) -> None:
        self.cards = cards
        self._lock = threading.Lock()
        self._event_set: Any = None
        self._event_cards: dict[int | None, int] = {}  # handle address -> card index
        self._asked: set[int] = set()  # handle addresses registered (or refused) in this set
        self._unsupported = False
        self._waiting = threading.Lock()  # held while a wait is inside NVML
        self._closed = False

    def close(self, timeout_s: float) -> None:
        """No more waits inside NVML: nvmlShutdown leaves the event set dangling, and a listener
        thread may still be waiting on it (a wait ends within its own timeout)."""
        self._closed = True  # first: a listener that loops straight back would win the lock again
        waited = self._waiting.acquire(timeout=timeout_s)  # the wait in flight ends
        if waited:
            self._waiting.release()

    def reset(self) -> None:
        """NVML was initialised again: the old set and handles are gone."""
        with self._lock:
            self._event_set, self._event_cards, self._asked = None, {}, set()

    def wait(self, timeout_s: float) -> list[tuple[int, int, int]]:
        """Block up to `timeout_s` for an event; (card index, event type, its data: the XID, or
        the recovery action) triples. Call from one thread."""
        error: pynvml.NVMLError | None = None
        with self._waiting:
            event_set = None if self._closed else self._prepare()
            if event_set is not None:
                try:
                    data = pynvml.nvmlEventSetWait_v2(event_set, int(timeout_s * 1000))
                except pynvml.NVMLError as exc:
                    error = exc
        if event_set is None:
            time.sleep(timeout_s)
            return []
        if error is not None:
            if error.value in DRIVER_GONE:
                self.reset()  # made again once the backend has initialised NVML again
            if error.value != pynvml.NVML_ERROR_TIMEOUT:
                time.sleep(timeout_s)  # e.g. GPU lost: do not spin
            return []
        with self._lock:
            index = self._event_cards.get(ctypes.cast(data.device, ctypes.c_void_p).value)
        if index is None or (data.eventType != XID and data.eventType not in EVENT_NAMES):
            return []
        return [(index, int(data.eventType), int(data.eventData))]

    def _prepare(self) -> Any:
        """The event set with every card that has a handle registered; None when there is none."""
        with self._lock:
            if self._unsupported:
                return None
            if self._event_set is None:
                try:
                    self._event_set = pynvml.nvmlEventSetCreate()
                except pynvml.NVMLError as exc:
                    if exc.value not in DRIVER_GONE:
                        log.info("NVML: no event support (%s): xid rules fire on nothing", exc)
                        self._unsupported = True
                    return None
            for card in self.cards():
                address = ctypes.cast(card.handle, ctypes.c_void_p).value if card.handle is not None else None
                # Only cards that answer: registering on a hung card would hang every card's XIDs.
                answered = card.last is not None and card.last.state == "ok"
                if address is None or address in self._asked or not answered:
                    continue
                self._asked.add(address)
                types = WANTED & _supported(card)
                try:
                    if not types:
                        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
                    pynvml.nvmlDeviceRegisterEvents(card.handle, types, self._event_set)
                except pynvml.NVMLError as exc:
                    log.info("NVML: card %d: events unavailable (%s)", card.index, exc)
                    continue
                self._event_cards[address] = card.index
            return self._event_set if self._event_cards else None


def _supported(card: Card) -> int:
    """The event types the card supports; XIDs alone where the driver cannot say (it predates the call)."""
    try:
        return int(pynvml.nvmlDeviceGetSupportedEventTypes(card.handle))
    except pynvml.NVMLError as exc:
        log.info("NVML: card %d: supported event types unknown (%s): XIDs only", card.index, exc)
        return XID
