"""The NVML backend against the fake libnvidia-ml.so.1, through the real nvidia-ml-py bindings."""

from __future__ import annotations

import ctypes
import getpass
import sys
import time

import psutil
import pytest
from conftest import GIB, Card

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import sample_once
from gpumon.errors import NoDriverError


@pytest.fixture
def open_backend(fake_driver):
    opened: list[NvmlBackend] = []

    def _open(lib=None) -> NvmlBackend:
        fake_driver.write()
        backend = NvmlBackend(lib_path=str(lib or fake_driver.lib))
        opened.append(backend)
        return backend

    yield _open
    for backend in opened:
        backend.close()


def calls(lib, fn: str) -> int:
    counter = ctypes.CDLL(str(lib)).fakeNvmlCallCount
    counter.restype = ctypes.c_ulong
    return counter(fn.encode())


def test_reports_exactly_what_the_driver_says(fake_driver, open_backend):
    m = fake_driver.machine
    m.driver, m.cuda = "535.104.05", 12020
    m.cards = [
        Card("Tesla V100-PCIE-32GB", uuid="GPU-11111111-2222-3333-4444-555555555555",
             bus="00000000:3B:00.0", mem_total=32 * GIB,
             extra=dict(mem_used=3 * GIB, util=37, mem_util=12, temp=61, fan=44, power_mw=123456,
                        power_limit_mw=250000, clock_sm=1245, clock_mem=877, pstate=2,
                        throttle=0x24, ecc_uncorrected=3, pcie_tx_kbs=1000, pcie_rx_kbs=2000,
                        enc=5, dec=7, cpus="0-3,8-9", numa=1)),
        Card("NVIDIA L4", mem_total=24 * GIB, extra=dict(util=0)),
    ]
    snap = open_backend().sample()
    assert snap.backend == "nvml"
    assert snap.driver_version == "535.104.05"
    assert snap.cuda_driver_version == "12.2"
    v100, l4 = snap.gpus
    assert (v100.index, v100.name, v100.uuid, v100.pci_bus_id) == (
        0, "Tesla V100-PCIE-32GB", "GPU-11111111-2222-3333-4444-555555555555", "00000000:3B:00.0")
    assert v100.state == "ok"
    assert (v100.memory_total, v100.memory_used, v100.memory_free) == (32 * GIB, 3 * GIB, 29 * GIB)
    assert (v100.utilization_gpu, v100.utilization_memory) == (37, 12)
    assert (v100.temperature, v100.fan) == (61, 44)
    assert v100.power_draw == pytest.approx(123.456)
    assert v100.power_limit == pytest.approx(250.0)
    assert (v100.clock_sm, v100.clock_mem, v100.pstate) == (1245, 877, "P2")
    assert v100.throttle_reasons == ("sw_power_cap", "sw_thermal")
    assert v100.ecc_errors_uncorrected == 3
    assert (v100.pcie_tx, v100.pcie_rx) == (1000 * 1024, 2000 * 1024)
    assert (v100.encoder_util, v100.decoder_util) == (5, 7)
    assert (v100.numa_node, v100.cpu_affinity) == (1, "0-3,8-9")
    assert l4.name == "NVIDIA L4" and l4.index == 1 and l4.processes == ()
    assert l4.cpu_affinity is None  # the fake card has no affinity: unsupported, not invented


def test_unsupported_fields_read_null_and_are_not_asked_again(fake_driver, open_backend):
    fake_driver.machine.cards = [Card(extra=dict(unsupported="fan,power,ecc", temp=50)), Card(extra=dict(fan=30))]
    backend = open_backend()
    first = backend.sample()
    before = calls(fake_driver.lib, "nvmlDeviceGetFanSpeed")
    for _ in range(3):
        snap = backend.sample()
    assert first.gpus[0].fan is None and snap.gpus[0].fan is None
    assert snap.gpus[0].power_draw is None and snap.gpus[0].ecc_errors_uncorrected is None
    assert snap.gpus[0].temperature == 50 and snap.gpus[0].state == "ok"
    assert snap.gpus[1].fan == 30
    # Three more samples asked only card 1 for its fan.
    assert calls(fake_driver.lib, "nvmlDeviceGetFanSpeed") - before == 3


def test_lost_card_is_lost_and_others_keep_reporting(fake_driver, open_backend):
    fake_driver.machine.cards = [Card(extra=dict(util=10)), Card(), Card(extra=dict(util=30))]
    backend = open_backend()
    assert [g.state for g in backend.sample().gpus] == ["ok", "ok", "ok"]
    # The card falls off the bus once gpumon knows it, not after a fixed time, which a busy
    # machine can pass before the first sample. The driver looks at its changed machine at most
    # every 50 ms: sample until it has.
    fake_driver.machine.cards[1].extra["lost_after"] = 0
    fake_driver.write()
    deadline = time.monotonic() + 10
    while (snap := backend.sample()).gpus[1].state == "ok" and time.monotonic() < deadline:
        pass
    assert [g.state for g in snap.gpus] == ["ok", "lost", "ok"]
    lost = snap.gpus[1]
    assert lost.utilization_gpu is None and lost.uuid and lost.name  # identity kept
    assert snap.gpus[2].utilization_gpu == 30


def test_card_without_permission_is_error_and_others_shown(fake_driver, open_backend):
    fake_driver.machine.cards = [Card(extra=dict(handle_error=4)), Card(name="NVIDIA T4")]
    snap = open_backend().sample()
    assert snap.gpus[0].state == "error"
    assert "Permission" in snap.gpus[0].error
    assert (snap.gpus[1].state, snap.gpus[1].name) == ("ok", "NVIDIA T4")


def test_unknown_error_marks_that_sample_error(fake_driver, open_backend):
    fake_driver.machine.cards = [Card(extra=dict(fail="util:999", temp=40))]
    gpu = open_backend().sample().gpus[0]
    assert gpu.state == "error" and gpu.utilization_gpu is None
    assert gpu.temperature == 40


def test_processes_merge_compute_and_graphics_with_sm_util(fake_driver, open_backend, idle_processes):
    a, b = idle_processes(), idle_processes()
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.procs = [
        dict(gpu=0, pid=a.pid, mem=2 * GIB, sm=55),
        dict(gpu=0, pid=a.pid, mem=2 * GIB, type="graphics"),
        dict(gpu=0, pid=b.pid, mem=GIB, type="graphics"),
    ]
    backend = open_backend()
    procs = {p.pid: p for p in backend.sample().gpus[0].processes}
    assert set(procs) == {a.pid, b.pid}
    assert (procs[a.pid].type, procs[a.pid].gpu_memory, procs[a.pid].sm_util) == ("compute", 2 * GIB, 55)
    assert (procs[b.pid].type, procs[b.pid].gpu_memory, procs[b.pid].sm_util) == ("graphics", GIB, 0)


def test_impossible_process_entries_are_dropped(fake_driver, open_backend, idle_processes):
    good = idle_processes()
    fake_driver.machine.cards = [Card(mem_total=16 * GIB)]
    fake_driver.machine.procs = [
        dict(gpu=0, pid=0, mem=GIB),
        dict(gpu=0, pid=good.pid + 100000, mem=64 * GIB),
        dict(gpu=0, pid=good.pid, mem=GIB),
    ]
    procs = open_backend().sample().gpus[0].processes
    assert [p.pid for p in procs] == [good.pid]


@pytest.mark.parametrize(
    "omit",
    [
        ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3"),
        ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
         "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    ],
    ids=["v2", "v1"],
)
def test_older_process_calls_are_used_when_newer_are_missing(fake_driver, open_backend, build_fake, idle_processes,
                                                              omit):
    proc = idle_processes()
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=3 * GIB, sm=20)]
    lib = build_fake(omit)
    expected_call = "nvmlDeviceGetComputeRunningProcesses" + ("_v2" if len(omit) == 2 else "")
    before = calls(lib, expected_call)
    procs = open_backend(lib).sample().gpus[0].processes
    assert [(p.pid, p.gpu_memory) for p in procs] == [(proc.pid, 3 * GIB)]
    assert calls(lib, expected_call) > before


def test_older_memory_and_throttle_calls(fake_driver, open_backend, build_fake):
    fake_driver.machine.cards = [Card(mem_total=8 * GIB, extra=dict(mem_used=GIB, mem_reserved=GIB, throttle=0x40))]
    lib = build_fake(("nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetCurrentClocksEventReasons"))
    gpu = open_backend(lib).sample().gpus[0]
    # Memory info v1 counts the driver's reservation as used.
    assert (gpu.memory_total, gpu.memory_used) == (8 * GIB, 2 * GIB)
    assert gpu.throttle_reasons == ("hw_thermal",)


def test_functions_missing_everywhere_read_null(fake_driver, open_backend, build_fake):
    fake_driver.machine.cards = [Card(extra=dict(temp=44))]
    lib = build_fake(("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
                      "nvmlDeviceGetProcessUtilization", "nvmlDeviceGetEncoderUtilization"))
    gpu = open_backend(lib).sample().gpus[0]
    assert gpu.state == "ok" and gpu.temperature == 44
    assert gpu.throttle_reasons is None and gpu.encoder_util is None


@pytest.mark.parametrize(
    ("code", "message"),
    [(18, "driver was upgraded: reboot or reload the nvidia kernel modules"),
     (9, "kernel driver is not loaded"),
     (999, "NVML failed to start")],
)
def test_init_errors_are_no_driver_errors(fake_driver, code, message):
    fake_driver.machine.init_error = code
    fake_driver.write()
    with pytest.raises(NoDriverError, match=message):
        NvmlBackend(lib_path=str(fake_driver.lib))


def test_missing_library_file_is_no_driver_error(tmp_path):
    with pytest.raises(NoDriverError, match="not found"):
        NvmlBackend(lib_path=str(tmp_path / "libnvidia-ml.so.1"))


def test_processes_are_enriched_with_psutil(fake_driver, open_backend, idle_processes):
    proc = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", "gpumon-test-marker")
    gone = idle_processes()
    gone_pid = gone.pid
    gone.kill()
    gone.wait()
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=GIB), dict(gpu=0, pid=gone_pid, mem=GIB)]
    snap = sample_once(open_backend())
    procs = {p.pid: p for p in snap.gpus[0].processes}
    mine = procs[proc.pid]
    assert mine.user == getpass.getuser()
    assert mine.command.endswith("gpumon-test-marker")
    assert mine.started == pytest.approx(psutil.Process(proc.pid).create_time())
    assert mine.rss and mine.rss > 0
    # An exited pid (or one in another PID namespace) keeps what the driver said.
    assert procs[gone_pid].user is None and procs[gone_pid].command is None
    assert procs[gone_pid].gpu_memory == GIB


def test_topology_matrix_nvlinks_and_affinity(fake_driver, open_backend):
    m = fake_driver.machine
    m.cards = ([Card(extra=dict(cpus="0-7", numa=0)) for _ in range(2)]
               + [Card(extra=dict(cpus="8-15", numa=1)) for _ in range(2)])
    m.links = [(0, 2, 50), (0, 3, 50), (1, 2, 50), (1, 3, 50), (2, 3, 20)]
    m.topo_default = 40
    m.nvlinks = [(0, 1, 4)]
    topo = open_backend().topology()
    assert topo.links[0] == ("X", "NV4", "SYS", "SYS")
    assert topo.links[2] == ("SYS", "SYS", "X", "PXB")
    assert topo.nvlinks[1][0] == 4
    assert topo.cpu_affinity == ("0-7", "0-7", "8-15", "8-15")
    assert topo.numa_node == (0, 0, 1, 1)


def test_gpumon_nvml_lib_environment_variable(fake_driver, monkeypatch):
    fake_driver.machine.cards = [Card(name="From Env")]
    fake_driver.write()
    monkeypatch.setenv("GPUMON_NVML_LIB", str(fake_driver.lib))
    backend = NvmlBackend()
    try:
        assert backend.sample().gpus[0].name == "From Env"
    finally:
        backend.close()


def test_pid_namespace_invisible_pid(fake_driver, open_backend):
    # A pid that does not exist here, as for a process in another PID namespace.
    pid = max(psutil.pids()) + 12345
    assert not psutil.pid_exists(pid)
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=pid, mem=GIB)]
    proc = sample_once(open_backend()).gpus[0].processes[0]
    assert (proc.pid, proc.user, proc.command, proc.gpu_memory) == (pid, None, None, GIB)


def test_mig_slices_are_enumerated_with_their_memory(fake_driver, open_backend):
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", mem_total=80 * GIB, extra=dict(mig=2)), Card()]
    gpu, plain = open_backend().sample().gpus
    assert [m.uuid[:4] for m in gpu.mig_devices] == ["MIG-", "MIG-"]
    assert len({m.uuid for m in gpu.mig_devices}) == 2
    assert all(m.memory_total == 40 * GIB for m in gpu.mig_devices)
    assert plain.mig_devices == ()
