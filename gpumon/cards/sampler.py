"""The sampling loop: backend -> enriched Snapshot -> subscribers, plus history for charts.

The backend is called in a daemon thread, one pass at a time: passes never overlap or pile up
behind a slow driver, the event loop never waits on NVML, and a call that hangs forever cannot
keep gpumon from exiting. A backend whose cards answer separately (a PerCardBackend: NVML, DRM) is
given a deadline, so a slow card delays only itself and comes back marked "stale"; when a whole
pass still runs past its interval, subscribers get the last snapshot again marked `stale`, and the
fresh one as soon as it arrives. The backend itself may be opened here too (`opener`), so a
driver that is slow to start does not hold up the first frame.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from gpumon.cards.backends import Backend
from gpumon.cards.procinfo import ProcessEnricher
from gpumon.errors import GpumonError
from gpumon.model import GpuSample, Snapshot, Topology
from gpumon.owners.reader import HostPaths

log = logging.getLogger(__name__)

Subscriber = Callable[[Snapshot], None]
MAX_CARD_WAIT_S = 2.0  # the longest a pass waits for a slow card before reporting it as it stands
ONCE_WAIT_S = 5.0  # one-off reads (snapshot, select, run) wait this long for slow cards by default


def card_wait(interval: float) -> float:
    """How long a pass waits for slow cards: half the interval (the rest is for everything else)."""
    return max(0.05, min(MAX_CARD_WAIT_S, interval / 2))


def read_topology(backend: Backend, wait_s: float | None = None,
                  on_progress: Callable[[Topology], None] | None = None) -> Topology:
    """backend.topology(), with a deadline and progress where the backend takes them (`read_once`'s shape)."""
    return backend.topology_within(wait_s, on_progress)


def _enricher(backend: Backend, owners: HostPaths) -> ProcessEnricher:
    """Reads the processes where the backend finds them (a host's /proc mounted elsewhere), their
    owners from the host's records where `owners` says."""
    return ProcessEnricher(procfs=backend.procfs, paths=owners)


class History:
    """Per card (by UUID: a card that comes back after a reset continues its history), the last
    `capacity` values of each charted metric."""

    METRICS: dict[str, Callable[[GpuSample], float | None]] = {
        "util": lambda g: g.utilization_gpu,
        "mem": lambda g: g.memory_percent,
        "temp": lambda g: g.temperature,
        "power": lambda g: g.power_draw,
    }

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._times: dict[str, deque[float]] = {}
        self._values: dict[tuple[str, str], deque[float | None]] = {}

    def add(self, snapshot: Snapshot) -> None:
        for gpu in snapshot.gpus:
            times = self._times.get(gpu.key)
            if times is None:
                times = self._times[gpu.key] = deque(maxlen=self.capacity)
                for metric in self.METRICS:
                    self._values[gpu.key, metric] = deque(maxlen=self.capacity)
            times.append(snapshot.time)
            for metric, read in self.METRICS.items():
                self._values[gpu.key, metric].append(read(gpu) if gpu.state == "ok" else None)

    def series(self, key: str, metric: str, seconds: float | None = None) -> tuple[list[float], list[float | None]]:
        """(times, values) of one card's metric (the card by its `key`: its UUID), the last
        `seconds` of it when given."""
        times = self._times.get(key)
        if not times:
            return [], []
        values = self._values[key, metric]
        start = 0
        if seconds is not None:
            cutoff = times[-1] - seconds
            start = next((i for i, t in enumerate(times) if t >= cutoff), len(times))
        return list(times)[start:], list(values)[start:]


def _run_and_settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], fn: Callable[[], Any]) -> None:
    """Run fn in this (worker) thread and hand its result or error to the loop's future."""
    try:
        result, error = fn(), None
    except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
        result, error = None, exc
    try:
        loop.call_soon_threadsafe(_settle, future, result, error)
    except RuntimeError:  # the loop closed while the driver call hung
        pass


def run_in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    threading.Thread(target=_run_and_settle, args=(loop, future, fn), name="gpumon-sample", daemon=True).start()
    return future


class PassThread:
    """One daemon thread that runs a sampler's passes, one after another, for as long as it lives.

    The sampler waits for each pass before it starts the next, so passes never overlapped even when
    each had a thread of its own; starting one every second cost the event loop ~1 ms of waiting for
    the thread to come up (Thread.start) and the thread's creation. A pass that hangs forever holds
    only this daemon thread, as it held its own before; `close` ends the thread once it is idle."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[[], Any]] | None] \
            = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], Any]) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="gpumon-sample", daemon=True)
            self._thread.start()
        self._work.put((loop, future, fn))
        return future

    def close(self) -> None:
        """The thread ends after the pass it is running, if any (the next submit starts another)."""
        if self._thread is not None:
            self._work.put(None)
            self._thread = None

    def _serve(self) -> None:
        while (work := self._work.get()) is not None:
            loop, future, fn = work
            _run_and_settle(loop, future, fn)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Sampler:
    def __init__(
        self,
        backend: Backend | None,
        interval: float = 1.0,
        history_seconds: float = 600.0,
        enrich: bool = True,
        opener: Callable[[], Backend] | None = None,
        owners: HostPaths = HostPaths(),
    ) -> None:
        """`backend`, or None and an `opener` that run() calls (in a thread) to make one; `owners`:
        where this host's records of who runs what are ([owners], --path.procfs)."""
        self.backend = backend
        self.owners = owners
        self.opener = opener
        self.interval = interval
        self._enrich = enrich
        # psutil is asked about every GPU process each sample: only when someone will show it.
        self.enricher = _enricher(backend, owners) if backend is not None and enrich and backend.real_pids else None
        # Interval 0 (replaying as fast as possible) sizes history as if sampled every 0.1 s.
        self.history = History(capacity=int(history_seconds / max(interval, 0.1)) + 1)
        self.latest: Snapshot | None = None
        self._subscribers: list[Subscriber] = []
        self._stop = asyncio.Event()
        self._passes = PassThread()

    async def open(self) -> Backend:
        """The backend, opened in a daemon thread the first time (the driver may be slow to start)."""
        if self.backend is None:
            assert self.opener is not None, "a Sampler needs a backend or an opener"
            backend = await run_in_daemon_thread(self.opener)
            self.backend = backend
            self.enricher = _enricher(backend, self.owners) if self._enrich and backend.real_pids else None
        return self.backend

    async def topology(self, on_progress: Callable[[Topology], None] | None = None,
                       wait_s: float = 30.0) -> Topology:
        """The backend's topology, read in a daemon thread; `on_progress` (called in that thread)
        gets the matrix so far as each card answers. Cards that do not answer are left out."""
        backend = await self.open()
        return await run_in_daemon_thread(lambda: read_topology(backend, wait_s, on_progress))

    def subscribe(self, callback: Subscriber) -> None:
        self._subscribers.append(callback)

    def collect(self, wait_s: float | None = None, allocations_wait_s: float = 0.0) -> Snapshot:
        """One blocking pass: read the backend and enrich processes. Runs in the worker thread.
        Slow cards are waited for up to `wait_s` (default: half the interval); a first answer from
        Slurm of the cards it has given jobs, up to `allocations_wait_s` (later ones come in the
        background)."""
        assert self.backend is not None, "open() the sampler first"
        snapshot = self.backend.sample_within(card_wait(self.interval) if wait_s is None else wait_s)
        if self.enricher is None:
            return snapshot
        return dataclasses.replace(snapshot, gpus=self.enricher.enrich_gpus(snapshot.gpus, allocations_wait_s))

    def _publish(self, snapshot: Snapshot) -> None:
        for callback in self._subscribers:
            try:
                callback(snapshot)
            except Exception:  # one broken view must not stop sampling for the others
                log.exception("snapshot subscriber failed")

    def stop(self) -> None:
        self._stop.set()

    async def run(self, count: int | None = None) -> None:
        """Sample every `interval` seconds until stop() (or `count` samples)."""
        loop = asyncio.get_running_loop()
        await self.open()
        taken = 0
        try:
            while not self._stop.is_set() and (count is None or taken < count):
                started = loop.time()
                pass_ = self._passes.submit(self.collect)
                snapshot = await self._await_pass(pass_, started)
                if snapshot is not None and snapshot is not self.latest:  # a paused replay repeats itself
                    self.latest = snapshot
                    self.history.add(snapshot)
                    self._publish(snapshot)
                taken += 1
                if count is not None and taken >= count:
                    break
                delay = max(0.0, started + self.interval - loop.time())
                try:
                    await asyncio.wait_for(self._stop.wait(), timeout=delay)
                except TimeoutError:
                    pass
        finally:
            self._passes.close()

    async def _await_pass(self, pass_: asyncio.Future[Any], started: float) -> Snapshot | None:
        loop = asyncio.get_running_loop()
        stop_wait = asyncio.ensure_future(self._stop.wait())
        try:
            marked_stale = False
            while True:
                timeout = None if marked_stale else max(0.0, started + self.interval - loop.time())
                done, _ = await asyncio.wait({pass_, stop_wait}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if pass_ in done:
                    break
                if stop_wait in done:
                    return None
                marked_stale = True
                if self.latest is not None:
                    self._publish(dataclasses.replace(self.latest, stale=True))
        finally:
            stop_wait.cancel()
        try:
            return pass_.result()
        except GpumonError:
            if self.latest is None:  # nothing sampled yet: the user must hear why (no driver, …)
                raise
            log.warning("sampling failed", exc_info=True)
        except Exception as exc:
            log.warning("sampling failed: %s", exc)
            if self.latest is not None:
                self._publish(dataclasses.replace(self.latest, stale=True))
            return None


def sample_once(backend: Backend, wait_s: float = ONCE_WAIT_S, owners: HostPaths = HostPaths()) -> Snapshot:
    """A single enriched snapshot, for `gpumon snapshot` and scripts; cards that have not answered
    within `wait_s` are reported as they stand ("stale"); `owners`: as Sampler's. On a Slurm node
    the cards Slurm has given jobs are waited for too (ONCE_WAIT_S at most): one look is all it gets."""
    return Sampler(backend, owners=owners).collect(wait_s=wait_s, allocations_wait_s=ONCE_WAIT_S)
