"""One worker thread per card ("lane"): every driver call for a card runs on its lane, in order.

A card whose calls hang (a card going bad, persistence mode off) then holds up only its own lane:
the other cards keep answering, and gpumon never has more than one call stuck per card, however
long the card stays stuck. Lanes are daemon threads, so a hung call never keeps gpumon from
exiting. Results come back as `concurrent.futures.Future`s, waited on with a deadline.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class Lanes:
    def __init__(self, name: str = "gpumon-card") -> None:
        self.name = name
        self._queues: dict[int, queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]]] = {}
        self._lock = threading.Lock()

    def submit(self, lane: int, fn: Callable[[], T]) -> Future[T]:
        """Run fn() on the lane after whatever it is doing now."""
        future: Future[T] = Future()
        with self._lock:
            work = self._queues.get(lane)
            if work is None:
                work = self._queues[lane] = queue.SimpleQueue()
                threading.Thread(target=_serve, args=(work,), name=f"{self.name}-{lane}", daemon=True).start()
        work.put((future, fn))
        return future


def _serve(work: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]]) -> None:
    while True:
        future, fn = work.get()
        if not future.set_running_or_notify_cancel():
            continue
        try:
            future.set_result(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(exc)
