"""XID errors as they happen: a daemon thread that waits on the backend's XID events and hands
each one to the event loop.

XIDs come as events, not in samples: a card can report XID 79 ("fell off the bus") between two
samples, so the TUI listens for them as `watch` does, whether or not a rule asks for them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from gpumon.cards.backends import Backend

POLL_S = 0.5  # how long each wait blocks: the thread notices stop() within this


class XidListener:
    """Calls `deliver(card index, XID, unix time)` on the event loop for each XID error."""

    def __init__(self, backend: Backend, deliver: Callable[[int, int, float], None]) -> None:
        self.backend = backend
        self.deliver = deliver
        self._stop = threading.Event()

    @staticmethod
    def available(backend: Backend) -> bool:
        return backend.xid_events

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
