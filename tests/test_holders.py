"""Who holds the cards (owners/holders.py), from real processes in real Slurm, kubepods and Docker
shaped cgroups, listed by the fake NVIDIA driver with their memory and per-process SM %, read by
the real sampler: one row per user and per job/pod/container, power shares, energy, and idle time
that starts when every process of a holder shows 0 % SM and ends when one computes again."""

from __future__ import annotations

import time

import pytest
from cgroup_lab import cgroup_lab  # noqa: F401 - the fixture
from conftest import GIB
from holders_lab import CONTAINER, FAKE_RELOAD_S, POD, place_holders, set_load

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import Sampler
from gpumon.model import ProcessOwner, ProcessSample, Snapshot
from gpumon.owners.holders import HolderTracker
from gpumon.units import format_duration


@pytest.fixture
def held(cgroup_lab, idle_processes, fake_driver):  # noqa: F811 - the fixture imported above
    """The three holders of holders_lab, read by a real sampler."""
    pids = place_holders(cgroup_lab, idle_processes, fake_driver)
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    yield pids, Sampler(backend)
    backend.close()


def rows(holders) -> dict[tuple[str, str], object]:
    return {(h.kind, h.id): h for h in holders}


def test_one_row_per_user_and_per_job_pod_and_container(held):
    pids, sampler = held
    tracker = HolderTracker()
    holders = rows(tracker.update(sampler.collect()))
    assert set(holders) == {("user", "root"), ("slurm", "77"), ("k8s", POD), ("container", CONTAINER[:12])}

    job = holders["slurm", "77"]
    assert (job.label, job.user, job.cards, job.processes, job.gpu_memory, job.sm_util) == \
           ("job 77", "root", (0, 1), 2, 20 * GIB, 120)
    # Card 0's 300 W split by SM time (60 : 20), card 1's 200 W all the job's.
    assert job.power_w == pytest.approx(225 + 200)
    # Its part of each card (what the usage ledger keeps per card per holder).
    assert [(s.index, s.gpu_memory, s.sm_util, round(s.power_w)) for s in job.shares()] == \
           [(0, 10 * GIB, 60, 225), (1, 10 * GIB, 60, 200)]
    assert job.shares()[0].uuid == job.uuids[0]
    assert holders["k8s", POD].power_w == pytest.approx(75)
    # Nobody computes on card 2: its power goes by memory, all to the container.
    box = holders["container", CONTAINER[:12]]
    assert (box.label, box.cards, box.power_w) == (f"docker:{CONTAINER[:12]}", (2,), pytest.approx(100))
    root = holders["user", "root"]
    assert (root.cards, root.processes, root.gpu_memory, root.power_w) == ((0, 1, 2), 4, 26 * GIB, pytest.approx(600))
    # Held since the processes started, which was before gpumon looked.
    assert job.held_s is not None and job.held_s >= 0
    assert job.uuids[0] is not None and job.uuids[0].startswith("GPU-")
    # Rows come grouped: the user first, then what runs under it.
    assert [h.kind for h in tracker.update(sampler.collect())][0] == "user"


def test_idle_starts_at_zero_sm_grows_and_ends_when_it_computes(held, fake_driver):
    pids, sampler = held
    tracker = HolderTracker()
    first = rows(tracker.update(sampler.collect()))
    # The container shows 0 % from the first look: idle since gpumon first saw it, never longer.
    assert first["container", CONTAINER[:12]].idle_s == 0
    assert first["slurm", "77"].idle_s is None and first["user", "root"].idle_s is None

    set_load(fake_driver, pids, job_sm=0, pod_sm=20, box_sm=0)
    time.sleep(0.3)
    stopped = rows(tracker.update(sampler.collect()))
    assert stopped["slurm", "77"].idle_s is not None
    assert stopped["k8s", POD].idle_s is None  # it still computes, so its user does too
    assert stopped["user", "root"].idle_s is None
    time.sleep(0.6)
    later = rows(tracker.update(sampler.collect()))
    job, box = later["slurm", "77"], later["container", CONTAINER[:12]]
    assert job.idle_s >= stopped["slurm", "77"].idle_s + 0.5
    assert box.idle_s >= 0.9 and box.idle_s <= box.watched_s
    assert job.idle_text() == f"idle {format_duration(job.idle_s)} holding 20G on 2 cards"

    set_load(fake_driver, pids, job_sm=0, pod_sm=0, box_sm=0)
    time.sleep(0.2)
    everyone = rows(tracker.update(sampler.collect()))
    # The user is idle since its last busy process (the pod) stopped: the latest of them.
    assert 0 <= everyone["user", "root"].idle_s <= everyone["k8s", POD].idle_s + 0.01
    assert everyone["user", "root"].idle_s < everyone["slurm", "77"].idle_s

    set_load(fake_driver, pids, job_sm=5, pod_sm=0, box_sm=0)
    again = rows(tracker.update(sampler.collect()))
    assert again["slurm", "77"].idle_s is None and again["user", "root"].idle_s is None
    assert again["k8s", POD].idle_s is not None


def test_energy_is_the_power_share_over_time_and_restarts_for_a_newcomer(held, fake_driver):
    pids, sampler = held
    tracker = HolderTracker()
    tracker.update(sampler.collect())
    start = time.time()
    time.sleep(0.5)
    holders = rows(tracker.update(sampler.collect()))
    elapsed = time.time() - start
    job = holders["slurm", "77"]
    assert job.energy_j == pytest.approx(425 * elapsed, rel=0.5)
    assert holders["user", "root"].energy_j > job.energy_j

    # The container leaves: its row goes, and its energy with it.
    fake_driver.machine.procs = [p for p in fake_driver.machine.procs if p["pid"] != pids["box"]]
    fake_driver.write()
    time.sleep(FAKE_RELOAD_S)
    assert ("container", CONTAINER[:12]) not in rows(tracker.update(sampler.collect()))


def test_unknown_per_process_sm_is_not_idle_and_a_fleet_resend_is_not_counted_twice():
    owner = ProcessOwner("slurm", "5", None, "bob")

    def snapshot(at: float, sm: int | None) -> Snapshot:
        from gpumon.model import GpuSample
        proc = ProcessSample(pid=10, type="compute", gpu_memory=GIB, sm_util=sm, user="bob", started=900.0,
                             owner=owner)
        return Snapshot(time=at, host="h", backend="nvml", driver_version=None, cuda_driver_version=None,
                        gpus=(GpuSample(index=0, uuid="GPU-x", name="A", pci_bus_id=None, power_draw=100.0,
                                        processes=(proc,)),))

    tracker = HolderTracker()
    unknown = rows(tracker.update(snapshot(1000.0, None)))
    assert unknown["slurm", "5"].idle_s is None and unknown["slurm", "5"].sm_util is None
    assert unknown["slurm", "5"].held_s == pytest.approx(100)
    tracker.update(snapshot(1010.0, 0))
    same = tracker.update(snapshot(1010.0, 0))
    assert rows(same)["slurm", "5"].energy_j == pytest.approx(1000)  # 100 W for 10 s, once
    # A gap longer than gpumon watched adds nothing: it was not looking.
    gap = rows(tracker.update(snapshot(2000.0, 0)))
    assert gap["slurm", "5"].energy_j == pytest.approx(1000)
    assert gap["slurm", "5"].idle_s == pytest.approx(1000)


def _cluster(at: float, *cards: tuple) -> Snapshot:
    """A snapshot as a cluster read through Prometheus gives it: cards named by their holder
    (`owner`), no processes. `cards`: (index, owner, utilisation, MiB used, W)."""
    from gpumon.model import GpuSample
    return Snapshot(time=at, host="node-a", backend="prometheus", driver_version=None, cuda_driver_version=None,
                    gpus=tuple(GpuSample(index=i, uuid=f"GPU-{i}", name="A100", pci_bus_id=None, owner=owner,
                                         utilization_gpu=util, memory_used=mib << 20, power_draw=watts)
                               for i, owner, util, mib, watts in cards))


def test_cards_named_by_their_source_are_held_per_card_and_idle_by_the_cards_utilisation():
    tracker = HolderTracker()
    pod, job = "ml/train-7f9c (main)", "job 42"
    first = rows(tracker.update(_cluster(1000.0, (0, pod, 70, 1000, 300.0), (1, pod, 30, 500, 200.0),
                                         (2, job, 50, 2000, 250.0), (3, "ml/a (c), ml/b (c)", 90, 100, 100.0),
                                         (4, None, 0, 0, 50.0))))
    # The pod's two cards are one holder; the card two pods share counts for nobody; a card nobody names neither.
    assert set(first) == {("k8s", "ml/train-7f9c"), ("slurm", "42")}
    p = first["k8s", "ml/train-7f9c"]
    assert (p.label, p.user, p.cards, p.uuids, p.processes, p.gpu_memory, p.sm_util, p.power_w, p.held_s, p.idle_s) \
        == (pod, None, (0, 1), ("GPU-0", "GPU-1"), 0, 1500 << 20, 100, 500.0, None, None)
    assert (first["slurm", "42"].label, first["slurm", "42"].cards) == (job, (2,))

    # The job's card stops computing: idle since it was last seen busy, then computing again.
    tracker.update(_cluster(1010.0, (0, pod, 70, 1000, 300.0), (2, job, 0, 2000, 250.0)))
    later = rows(tracker.update(_cluster(1030.0, (0, pod, 0, 1000, 300.0), (2, job, 0, 2000, 250.0))))
    assert later["slurm", "42"].idle_s == pytest.approx(30) and later["slurm", "42"].watched_s == pytest.approx(30)
    assert later["slurm", "42"].idle_text() == "idle 30s holding 2.0G on 1 card"
    assert later["k8s", "ml/train-7f9c"].idle_s == pytest.approx(20)  # its card 1 is gone; card 0 idle since 1010
    assert later["slurm", "42"].energy_j == pytest.approx(250 * 30)
    assert rows(tracker.update(_cluster(1040.0, (2, job, 5, 2000, 250.0))))["slurm", "42"].idle_s is None

    # Another job takes the card: its idle clock starts when gpumon first sees it there.
    other = rows(tracker.update(_cluster(1050.0, (2, "job 43", 0, 2000, 250.0))))
    assert set(other) == {("slurm", "43")} and other["slurm", "43"].idle_s == 0
    # A card that does not say its utilisation: not known to be idle.
    unknown = rows(tracker.update(_cluster(1060.0, (2, "job 43", None, 2000, 250.0))))
    assert unknown["slurm", "43"].idle_s is None and unknown["slurm", "43"].sm_util is None


def test_a_card_that_lists_processes_is_counted_by_its_processes_only():
    from gpumon.model import GpuSample
    proc = ProcessSample(pid=10, type="compute", gpu_memory=GIB, sm_util=0, user="bob", started=900.0,
                         owner=ProcessOwner("slurm", "5", None, "bob"))
    snapshot = Snapshot(time=1000.0, host="h", backend="prometheus", driver_version=None, cuda_driver_version=None,
                        gpus=(GpuSample(index=0, uuid="GPU-x", name="A", pci_bus_id=None, owner="job 5",
                                        utilization_gpu=80, memory_used=4 * GIB, processes=(proc,)),))
    holders = rows(HolderTracker().update(snapshot))
    assert set(holders) == {("user", "bob"), ("slurm", "5")}
    assert (holders["slurm", "5"].processes, holders["slurm", "5"].gpu_memory) == (1, GIB)
