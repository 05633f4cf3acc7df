"""CUDA ordinals as a program started from a given environment would see them; process helpers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpumon.cards.cuda_order import cuda_ordinals
from gpumon.jobs import processes as actions
from gpumon.model import GpuSample
from gpumon.owners.containers import container_of


def gpu(index: int, bus: str, name: str = "NVIDIA A100", uuid: str | None = None) -> GpuSample:
    return GpuSample(index=index, uuid=uuid or f"GPU-{index}{index}{index}-x", name=name, pci_bus_id=bus)


# NVML order 0,1,2 but the bus ids are not in that order (it happens with some BIOSes).
CARDS = [gpu(0, "00000000:81:00.0"), gpu(1, "00000000:01:00.0"), gpu(2, "00000000:41:00.0")]


def test_nothing_to_say_without_the_variables():
    assert cuda_ordinals(CARDS, {}) is None


def test_pci_bus_order_and_visible_devices_renumbering():
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert cuda_ordinals(CARDS, env) == {1: "0", 2: "1", 0: "2"}
    env["CUDA_VISIBLE_DEVICES"] = "2,0"
    # CUDA's index 2 is NVML card 0, CUDA's index 0 is NVML card 1.
    assert cuda_ordinals(CARDS, env) == {0: "0", 1: "1", 2: "hidden"}


def test_uuid_prefixes_and_invalid_entries_stop_the_list():
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "GPU-222,7,GPU-000"}
    assert cuda_ordinals(CARDS, env) == {2: "0", 0: "hidden", 1: "hidden"}


def test_empty_visible_devices_hides_everything():
    assert set(cuda_ordinals(CARDS, {"CUDA_VISIBLE_DEVICES": ""}).values()) == {"hidden"}


def test_fastest_first_with_mixed_models_is_unknown():
    mixed = [gpu(0, "00000000:01:00.0", "NVIDIA GeForce RTX 3090"),
             gpu(1, "00000000:02:00.0", "NVIDIA GeForce RTX 4090")]
    assert cuda_ordinals(mixed, {"CUDA_VISIBLE_DEVICES": "0"}) == {0: "?", 1: "?"}
    assert cuda_ordinals(mixed, {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}) == {
        0: "0", 1: "hidden"}


@pytest.mark.parametrize(
    ("cgroup", "expected"),
    [
        ("0::/system.slice/docker-3f2a9c0d1e2b4a5c6d7e8f90123456789abcdef0123456789abcdef01234567.scope\n",
         "docker 3f2a9c0d1e2b"),
        ("12:pids:/docker/ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12\n", "docker ab12cd34ef56"),
        ("0::/machine.slice/libpod-0123456789ab0123456789ab0123456789ab0123456789ab0123456789ab.scope/container\n",
         "podman 0123456789ab"),
        ("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b3c4d_5e6f_7a8b_9c0d_1e2f3a4b5c6d.slice/cri-containerd-aa.scope\n",
         "k8s pod 1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"),
        ("0::/user.slice/user-1000.slice/session-2.scope\n", None),
    ],
)
def test_container_from_cgroup(tmp_path, cgroup, expected):
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(cgroup)
    assert container_of(42, proc_root=tmp_path) == expected


def test_container_of_missing_pid(tmp_path):
    assert container_of(999999, proc_root=tmp_path) is None


def test_signal_checks_the_start_time_so_recycled_pids_are_safe():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import psutil
        started = psutil.Process(child.pid).create_time()
        with pytest.raises(actions.ActionError, match="different process"):
            actions.send_signal(child.pid, started - 100, "terminate")
        assert child.poll() is None
        assert "SIGTERM" in actions.send_signal(child.pid, started, "terminate")
        assert child.wait(5) != 0
        with pytest.raises(actions.ActionError, match="exited"):
            actions.send_signal(child.pid, started, "kill")
    finally:
        child.kill()
        child.wait()


def test_environment_of_a_process():
    child = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                             env=dict(os.environ, CUDA_VISIBLE_DEVICES="GPU-abc"), stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"  # past exec: its environment is in place
        import psutil
        env = actions.environment(child.pid, psutil.Process(child.pid).create_time())
        assert env["CUDA_VISIBLE_DEVICES"] == "GPU-abc"
    finally:
        child.kill()
        child.wait()


def test_may_signal_own_processes():
    assert actions.may_signal(os.geteuid())
