"""The sampling loop: never blocks the event loop, never piles up, marks late data stale."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from conftest import GIB, Card

from gpumon.cards.backends.demo import DemoBackend
from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import History, Sampler


def _threads(prefix: str) -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith(prefix))


async def _watch_loop(sampler: Sampler, seconds: float) -> tuple[float, int, int]:
    """Run the sampler for `seconds` while measuring the event loop's longest stall and the most
    sampling threads and card lanes alive at once."""
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(sampler.run())
    worst_gap, most_passes, most_lanes = 0.0, 0, 0
    last = loop.time()
    end = last + seconds
    while loop.time() < end:
        await asyncio.sleep(0.01)
        now = loop.time()
        worst_gap = max(worst_gap, now - last)
        most_passes = max(most_passes, _threads("gpumon-sample"))
        most_lanes = max(most_lanes, _threads("gpumon-card-"))
        last = now
    sampler.stop()
    await task
    return worst_gap, most_passes, most_lanes


def test_slow_driver_call_does_not_stall_the_loop_or_pile_up(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(util=10)) for _ in range(2)]
    fake_driver.machine.delays = {"nvmlDeviceGetUtilizationRates": 600}
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    sampler = Sampler(backend, interval=0.1)
    seen: list[str] = []
    sampler.subscribe(lambda snap: seen.extend(g.state for g in snap.gpus))
    before = _threads("gpumon-card-")
    try:
        worst_gap, most_passes, most_lanes = asyncio.run(_watch_loop(sampler, 3.0))
    finally:
        backend.close()
    # Each card answers every 0.6 s; the loop itself must keep turning (generous bound for noisy CI).
    assert worst_gap < 0.5
    assert most_passes <= 1
    assert most_lanes - before <= 2, "one lane per card, however many passes asked"
    assert "ok" in seen, "fresh samples arrived"


def test_a_late_pass_republishes_the_last_snapshot_as_stale():
    # A backend that answers as a whole (no per-card deadline): a slow pass is covered by the
    # sampler's own stale marking.
    class Slow(DemoBackend):
        def sample(self):
            if self.step >= 1:
                time.sleep(0.6)
            return super().sample()

    sampler = Sampler(Slow(), interval=0.1)
    seen: list[bool] = []
    sampler.subscribe(lambda snap: seen.append(snap.stale))
    asyncio.run(sampler.run(count=3))
    assert False in seen and True in seen


def test_sampler_keeps_its_interval_with_a_fast_backend():
    sampler = Sampler(DemoBackend(), interval=0.1)
    times: list[float] = []
    sampler.subscribe(lambda snap: times.append(snap.time))
    asyncio.run(sampler.run(count=5))
    assert len(times) == 5
    assert sampler.latest is not None and not sampler.latest.stale


def test_failing_backend_keeps_last_snapshot_and_goes_on():
    class Flaky(DemoBackend):
        def sample(self):
            if self.step == 1:
                self.step += 1
                raise RuntimeError("driver hiccup")
            return super().sample()

    sampler = Sampler(Flaky(), interval=0.1)
    got: list[bool] = []
    sampler.subscribe(lambda snap: got.append(snap.stale))
    asyncio.run(sampler.run(count=4))
    assert got.count(False) == 3 and True in got


def test_history_ring_buffer_keeps_the_window():
    backend = DemoBackend()
    history = History(capacity=5)
    for _ in range(8):
        history.add(backend.sample())
    uuid = backend.sample().gpus[0].uuid
    times, values = history.series(uuid, "util")
    assert len(times) == len(values) == 5
    assert all(v is not None for v in values)
    times_last, _ = history.series(uuid, "util", seconds=0)
    assert len(times_last) == 1


def test_default_history_covers_ten_minutes():
    sampler = Sampler(DemoBackend(), interval=1.0)
    assert sampler.history.capacity >= 600


def test_demo_pids_are_never_enriched():
    assert Sampler(DemoBackend()).enricher is None


def test_lost_card_history_has_gaps(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(lost_after=0))]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        history = History(capacity=3)
        snap = backend.sample()
        history.add(snap)
        assert snap.gpus[0].uuid is None  # lost before it could be asked: no identity to show
        assert history.series(snap.gpus[0].key, "util")[1] == [None]
    finally:
        backend.close()


@pytest.mark.parametrize("cards", [1, 8])
def test_collect_enriches_real_processes(fake_driver, idle_processes, cards):
    procs = [idle_processes() for _ in range(cards)]
    fake_driver.machine.cards = [Card() for _ in range(cards)]
    fake_driver.machine.procs = [dict(gpu=i, pid=p.pid, mem=GIB) for i, p in enumerate(procs)]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        snap = Sampler(backend).collect()
    finally:
        backend.close()
    assert [g.processes[0].pid for g in snap.gpus] == [p.pid for p in procs]
    assert all(g.processes[0].command for g in snap.gpus)


def test_passes_run_on_one_thread_that_ends_with_the_sampler(fake_driver):
    """A thread started for every pass cost the event loop its start-up each second; the
    passes (never overlapping anyway) share one daemon thread, which ends when sampling stops."""
    fake_driver.machine.cards = [Card(extra=dict(util=10))]
    fake_driver.machine.delays = {"nvmlDeviceGetUtilizationRates": 40}  # each pass is seen running
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    sampler = Sampler(backend, interval=0.05)
    seen: set[threading.Thread] = set()  # the threads themselves: an ident is reused once a thread ends
    samples: list[float] = []
    sampler.subscribe(lambda snap: samples.append(snap.time))

    async def run() -> None:
        task = asyncio.create_task(sampler.run(count=12))
        while not task.done():
            seen.update(t for t in threading.enumerate() if t.name == "gpumon-sample")
            await asyncio.sleep(0.005)
        await task

    try:
        asyncio.run(run())
    finally:
        backend.close()
    assert len(samples) == 12
    assert len(seen) == 1, f"{len(seen)} threads ran the passes"
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in seen) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in seen), "the pass thread outlived the sampler"
