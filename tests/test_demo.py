"""The simulated backend: deterministic, plausible, and every scenario does what it says."""

from __future__ import annotations

import dataclasses

import pytest

from gpumon.cards.backends.demo import LOST_AFTER_SAMPLES, SCENARIOS, DemoBackend
from gpumon.errors import UsageError
from gpumon.model import Snapshot


def _values(snapshot):
    """Everything but wall-clock times (process start times follow the clock)."""
    return [
        dataclasses.replace(g, processes=tuple(dataclasses.replace(p, started=None) for p in g.processes))
        for g in snapshot.gpus
    ]


def test_same_seed_same_values_other_seed_other_values():
    a, b, c = DemoBackend(seed=1), DemoBackend(seed=1), DemoBackend(seed=2)
    for _ in range(5):
        sa, sb, sc = a.sample(), b.sample(), c.sample()
    assert _values(sa) == _values(sb)
    assert [g.uuid for g in sa.gpus] != [g.uuid for g in sc.gpus]


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_every_scenario_is_plausible(scenario):
    backend = DemoBackend(scenario)
    for _ in range(30):
        snap = backend.sample()
        assert snap.backend == "demo"
        for gpu in snap.gpus:
            if gpu.state != "ok":
                continue
            assert 0 <= gpu.utilization_gpu <= 100
            assert 0 < gpu.power_draw <= gpu.power_limit
            assert len({p.pid for p in gpu.processes}) == len(gpu.processes)
            if gpu.vendor == "intel":  # as the kernel says it: no UUID, no memory in use for the whole card
                assert gpu.uuid is None and gpu.memory_used is None and gpu.vendor_index is not None
                continue
            assert 0 < gpu.memory_used <= gpu.memory_total
            assert gpu.memory_used + gpu.memory_free == gpu.memory_total
            assert gpu.uuid.startswith("GPU-")


def test_mixed_host_lists_nvidia_then_amd_then_intel():
    snap = DemoBackend("mixed").sample()
    assert [g.vendor for g in snap.gpus] == ["nvidia", "nvidia", "amd", "amd", "intel"]
    assert [g.vendor_index for g in snap.gpus] == [None, None, 0, 1, 0]
    amd = snap.gpus[2]
    assert amd.uuid and len(amd.uuid) == len("GPU-") + 16  # ROCm's form: GPU- and 16 hex digits
    assert amd.temperature_junction > amd.temperature and amd.pstate is None and amd.throttle_reasons is None
    assert [g.vendor for g in Snapshot.from_dict(snap.to_dict()).gpus] == [g.vendor for g in snap.gpus]
    topo = DemoBackend("mixed").topology()
    assert topo.links[2][3] == "XGMI" and topo.links[0][1] == "NV12" and topo.links[1][2] == "SYS"


def test_default_has_four_datacenter_cards_with_training_jobs():
    snap = DemoBackend().sample()
    assert len(snap.gpus) == 4
    assert any("train.py" in p.command for g in snap.gpus for p in g.processes)


def test_workstation_is_a_mixed_consumer_box():
    snap = DemoBackend("workstation").sample()
    assert ["3090" in snap.gpus[0].name, "4090" in snap.gpus[1].name] == [True, True]
    assert snap.gpus[0].fan is not None and snap.gpus[0].ecc_errors_uncorrected is None
    assert any(p.type == "graphics" for p in snap.gpus[0].processes)


def test_hot_card_overheats_and_throttles():
    backend = DemoBackend("hot")
    for _ in range(20):
        snap = backend.sample()
    assert snap.gpus[0].temperature >= 85
    assert "hw_thermal" in snap.gpus[0].throttle_reasons
    assert snap.gpus[1].temperature < 85


def test_lost_card_falls_off_the_bus():
    backend = DemoBackend("lost")
    states = [backend.sample().gpus[2].state for _ in range(LOST_AFTER_SAMPLES + 2)]
    assert states[0] == "ok" and states[-1] == "lost"
    assert backend.sample().gpus[1].state == "ok"


def test_more_cards_repeat_the_pattern_with_unique_pids():
    snap = DemoBackend(cards=16).sample()
    pids = [p.pid for g in snap.gpus for p in g.processes]
    assert len(snap.gpus) == 16 and len(pids) == len(set(pids))


def test_unknown_scenario():
    with pytest.raises(UsageError, match="unknown demo scenario"):
        DemoBackend("nope")


def test_topology_has_nvlink_pairs_across_two_sockets():
    topo = DemoBackend(cards=8).topology()
    assert topo.links[0][1].startswith("NV") and topo.links[0][4] == "SYS"
    assert topo.numa_node[0] == 0 and topo.numa_node[7] == 1
