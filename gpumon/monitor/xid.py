"""XID errors for views: a daemon thread that waits on the backend's XID events and hands each one
to the event loop, and the recent XIDs of each card, in words, for its panel.

XIDs come as events, not in samples: a card can report XID 79 ("fell off the bus") between two
samples, so the TUI listens for them as `watch` does, whether or not a rule asks for them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable

from gpumon.monitor.backends import Backend

POLL_S = 0.5  # how long each wait blocks: the thread notices stop() within this
RECENT_S = 3600.0  # a panel shows a card's XIDs of the last hour
KEEP = 3  # … at most this many, newest first

# XIDs after which the card cannot be trusted until it is reset (NVIDIA's XID catalogue,
# docs.nvidia.com/deploy/xid-errors): the programs on it have lost their context or their memory
# may be corrupt. Failover moves jobs off a card that reports one; the health verdict fails it.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "fell off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# What fixes each, after the catalogue's recommended actions.
XID_ACTIONS: dict[int, str] = {
    48: "drain the card and reset it (nvidia-smi -r); if it happens again, the card needs service (RMA)",
    63: "drain the card and reset it so the remap or retirement takes effect",
    64: "reset the card; if the failure repeats, the card needs service (RMA)",
    74: "check the NVLink bridge or baseboard, then reset the card; if it repeats, service (RMA)",
    79: "reset the card or reboot; check its power, cooling and seating; if it repeats, service (RMA)",
    92: "watch its ECC counters; if the rate stays high, the card needs service (RMA)",
    94: "restart the programs that used it; reset the card when it is free to remap the row",
    95: "reset the card (every program on it is affected)",
    119: "reset the card; if it repeats, update the driver and GPU firmware",
    120: "reset the card; if it repeats, update the driver and GPU firmware",
}


class XidListener:
    """Calls `deliver(card index, XID, unix time)` on the event loop for each XID error."""

    def __init__(self, backend: Backend, deliver: Callable[[int, int, float], None]) -> None:
        self.backend = backend
        self.deliver = deliver
        self._stop = threading.Event()

    @staticmethod
    def available(backend: Backend) -> bool:
        return hasattr(backend, "wait_xid")

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        threading.Thread(target=self._listen, args=(loop,), name="gpumon-xid", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        while not self._stop.is_set():
            for index, code in self.backend.wait_xid(POLL_S):
                try:
                    loop.call_soon_threadsafe(self.deliver, index, code, time.time())
                except RuntimeError:  # the loop closed
                    return


class RecentXids:
    """The last few XIDs of each card."""

    def __init__(self) -> None:
        self._seen: dict[int, deque[tuple[int, float]]] = {}

    def record(self, index: int, code: int, when: float) -> None:
        self._seen.setdefault(index, deque(maxlen=KEEP)).appendleft((code, when))

    def texts(self, index: int, now: float) -> tuple[str, ...]:
        """'XID 79 2m ago', newest first; nothing older than RECENT_S."""
        return tuple(f"XID {code} {_ago(now - when)}" for code, when in self._seen.get(index, ())
                     if now - when < RECENT_S)


def _ago(seconds: float) -> str:
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m ago"
    return f"{seconds // 3600:.0f}h ago"
