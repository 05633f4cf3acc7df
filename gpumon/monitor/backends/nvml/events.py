"""XID errors, read from an NVML event set in their own thread (watch and the TUI)."""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Any

import pynvml

from gpumon.monitor.backends.nvml.library import Card

log = logging.getLogger(__name__)


class XidEvents:
    """Opened on first use; when the driver has no event support, waiting just sleeps."""

    def __init__(self, cards: list[Card]) -> None:
        self.cards = cards
        self._event_set: Any = None
        self._event_cards: dict[int | None, int] = {}
        self._failed = False

    def wait(self, timeout_s: float) -> list[tuple[int, int]]:
        """Block up to `timeout_s` for XID errors; (card index, XID) pairs. Call from one thread."""
        if self._event_set is None and not self._open():
            time.sleep(timeout_s)
            return []
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_TIMEOUT:
                time.sleep(timeout_s)  # e.g. GPU lost: do not spin
            return []
        index = self._event_cards.get(ctypes.cast(data.device, ctypes.c_void_p).value)
        if index is None or data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return []
        return [(index, int(data.eventData))]

    def _open(self) -> bool:
        if self._failed:
            return False
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("NVML: no event support (%s): xid rules fire on nothing", exc)
            self._failed = True
            return False
        for card in self.cards:
            if card.handle is None:
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(card.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError as exc:
                log.info("NVML: card %d: XID events unavailable (%s)", card.index, exc)
                continue
            self._event_cards[ctypes.cast(card.handle, ctypes.c_void_p).value] = card.index
        if not self._event_cards:
            self._failed = True
            return False
        self._event_set = event_set
        return True
