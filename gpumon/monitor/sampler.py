"""The sampling loop: backend -> enriched Snapshot -> subscribers, plus history for charts.

The backend is called in a daemon thread, one pass at a time: passes never overlap or pile up
behind a slow driver, the event loop never waits on NVML, and a call that hangs forever cannot
keep gpumon from exiting. When a pass runs past its interval, subscribers get the last snapshot
again marked `stale`, and the fresh one as soon as it arrives.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from gpumon.model import GpuSample, Snapshot, Topology
from gpumon.monitor.backends import Backend
from gpumon.monitor.procinfo import ProcessEnricher

log = logging.getLogger(__name__)

Subscriber = Callable[[Snapshot], None]


class History:
    """Per card (by UUID), the last `capacity` values of each charted metric."""

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
            times = self._times.get(gpu.uuid)
            if times is None:
                times = self._times[gpu.uuid] = deque(maxlen=self.capacity)
                for metric in self.METRICS:
                    self._values[gpu.uuid, metric] = deque(maxlen=self.capacity)
            times.append(snapshot.time)
            for metric, read in self.METRICS.items():
                self._values[gpu.uuid, metric].append(read(gpu) if gpu.state == "ok" else None)

    def series(self, uuid: str, metric: str, seconds: float | None = None) -> tuple[list[float], list[float | None]]:
        """(times, values) of one card's metric, the last `seconds` of it when given."""
        times = self._times.get(uuid)
        if not times:
            return [], []
        values = self._values[uuid, metric]
        start = 0
        if seconds is not None:
            cutoff = times[-1] - seconds
            start = next((i for i, t in enumerate(times) if t >= cutoff), len(times))
        return list(times)[start:], list(values)[start:]


def _run_in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        try:
            result, error = fn(), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed while the driver call hung
            pass

    threading.Thread(target=target, name="gpumon-sample", daemon=True).start()
    return future


class Sampler:
    def __init__(
        self,
        backend: Backend,
        interval: float = 1.0,
        history_seconds: float = 600.0,
        enrich: bool = True,
    ) -> None:
        self.backend = backend
        self.interval = interval
        # psutil is asked about every GPU process each sample: only when someone will show it.
        self.enricher = ProcessEnricher() if enrich and backend.real_pids else None
        # Interval 0 (replaying as fast as possible) sizes history as if sampled every 0.1 s.
        self.history = History(capacity=int(history_seconds / max(interval, 0.1)) + 1)
        self.latest: Snapshot | None = None
        self.in_flight = False
        self._subscribers: list[Subscriber] = []
        self._stop = asyncio.Event()
        self._topology: Topology | None = None

    async def topology(self) -> Topology:
        """The backend's topology, read once in the worker thread (it does not change)."""
        if self._topology is None:
            self._topology = await _run_in_daemon_thread(self.backend.topology)
        return self._topology

    def subscribe(self, callback: Subscriber) -> None:
        self._subscribers.append(callback)

    def collect(self) -> Snapshot:
        """One blocking pass: read the backend and enrich processes. Runs in the worker thread."""
        snapshot = self.backend.sample()
        if self.enricher is None:
            return snapshot
        alive: set[int] = set()
        gpus = []
        for gpu in snapshot.gpus:
            if gpu.processes:
                alive.update(p.pid for p in gpu.processes)
                gpu = dataclasses.replace(gpu, processes=self.enricher.enrich(gpu.processes))
            gpus.append(gpu)
        self.enricher.forget_missing(alive)
        return dataclasses.replace(snapshot, gpus=tuple(gpus))

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
        taken = 0
        while not self._stop.is_set() and (count is None or taken < count):
            started = loop.time()
            pass_ = _run_in_daemon_thread(self.collect)
            self.in_flight = True
            snapshot = await self._await_pass(pass_, started)
            self.in_flight = False
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
        except Exception as exc:
            log.warning("sampling failed: %s", exc)
            if self.latest is not None:
                self._publish(dataclasses.replace(self.latest, stale=True))
            return None


def sample_once(backend: Backend) -> Snapshot:
    """A single enriched snapshot, for `gpumon snapshot` and scripts."""
    return Sampler(backend).collect()
