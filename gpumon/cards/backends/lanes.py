"""One worker thread per card ("lane"): every driver call or kernel file read for a card runs on its
lane, in order (NVML's calls; AMD's and Intel's sysfs and hwmon files).

A card whose calls hang (a card going bad, persistence mode off, a hung SMU behind a sysfs file)
then holds up only its own lane: the other cards keep answering, and gpumon never has more than
one call stuck per card, however long the card stays stuck. Lanes are daemon threads, so a hung
call never keeps gpumon from exiting. Results come back as `concurrent.futures.Future`s, waited on with a deadline.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
STALE_AFTER_S = 3.0  # a card whose last answer is older than this, and still busy, is "stale"


def settle(future: Future[Any], timeout: float) -> None:
    """Wait up to `timeout` for the future (its outcome is read later)."""
    try:
        future.exception(timeout=max(0.0, timeout))
    except TimeoutError:
        pass


def not_responding(stale_s: float) -> str:
    """A stale card's `error`, the same words for every vendor."""
    return f"not responding for {stale_s:.0f} s"


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
