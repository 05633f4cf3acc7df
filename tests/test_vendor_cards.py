"""AMD and Intel cards read from the kernel's files: fake sysfs trees written as the kernel lays
them out (tests/fakedrm.py), read by the real backend and by the real gpumon command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import GIB, Card
from fakedrm import (
    I915_HWMON,
    MI210,
    MI210_HWMON,
    OLD_KERNEL_DROPS,
    RX7900,
    RX7900_HWMON,
    amdgpu_fdinfo,
    i915_fdinfo,
    write,
    xe_fdinfo,
)

from gpumon.cards.backends.drm import DrmBackend
from gpumon.cards.backends.drm.backend import DISCOVER_S
from gpumon.fleet.schema import snapshot_from_remote, topology_from_remote


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def backend(kernel, clock=None, **options) -> DrmBackend:
    return DrmBackend(sysfs=str(kernel.sys.root), procfs=str(kernel.proc.root), clock=clock or Clock(), **options)


def test_an_instinct_card_shows_every_value_amdgpu_documents(fake_kernel):
    fake_kernel.sys.amd(numa=1, cpus="0-1")
    doc = fake_kernel.snapshot()
    assert doc["backend"] == "drm" and doc["cuda_driver_version"] is None
    (gpu,) = doc["gpus"]
    assert {k: gpu[k] for k in ("index", "vendor", "uuid", "name", "pci_bus_id", "state", "asleep")} == {
        "index": 0, "vendor": "amd", "uuid": "GPU-5a2c1e8172f8a8b6", "name": "AMD Instinct MI210",
        "pci_bus_id": "00000000:03:00.0", "state": "ok", "asleep": False}
    assert (gpu["utilization_gpu"], gpu["utilization_memory"]) == (37, 12)
    assert (gpu["memory_total"], gpu["memory_used"], gpu["memory_free"]) == (64 * GIB, 3 * GIB, 61 * GIB)
    assert (gpu["gtt_total"], gpu["gtt_used"]) == (128 * GIB, 20 << 20)
    # The card's temperature is the edge sensor; junction and memory beside it.
    assert (gpu["temperature"], gpu["temperature_junction"], gpu["temperature_memory"]) == (45, 52, 48)
    assert (gpu["power_draw"], gpu["power_limit"], gpu["fan"]) == (123.0, 300.0, None)  # no fan on an MI210
    assert (gpu["clock_sm"], gpu["clock_mem"]) == (1700, 1600)
    assert (gpu["pcie_link_speed"], gpu["pcie_link_width"], gpu["pcie_link_speed_max"]) == (16.0, 16, 32.0)
    assert (gpu["vbios"], gpu["serial"], gpu["perf_level"]) == ("113-D67301-063", "692231000131", "auto")
    assert (gpu["numa_node"], gpu["cpu_affinity"]) == (1, "0-1")
    # NVIDIA's own fields are not estimated for it.
    assert gpu["pstate"] is None and gpu["throttle_reasons"] is None and gpu["pcie_tx"] is None
    # The fleet's checker takes the document as it is.
    remote = snapshot_from_remote(doc).gpus[0]
    assert (remote.vendor, remote.temperature_junction, remote.asleep, remote.vbios) == ("amd", 52, False,
                                                                                          "113-D67301-063")


def test_a_radeon_is_named_from_pci_ids_and_reads_its_fan(fake_kernel, tmp_path):
    card = fake_kernel.sys.amd(files=RX7900, hwmon=RX7900_HWMON)
    pci_ids = tmp_path / "pci.ids"
    pci_ids.write_text("# comment\n10de  NVIDIA Corporation\n\t744c  something else\n1002  Advanced Micro Devices,"
                       " Inc. [AMD/ATI]\n\t73bf  Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]\n\t744c  Navi 31 [Radeon"
                       " RX 7900 XT/7900 XTX/7900 GRE/7900M]\n\t\t1002 0e3b  some board\n1014  IBM\n")
    (gpu,) = backend(fake_kernel, pci_ids=(str(pci_ids),)).sample().gpus
    assert gpu.name == "AMD Radeon RX 7900 XT/7900 XTX/7900 GRE/7900M"
    assert (gpu.fan, gpu.power_draw, gpu.clock_sm, gpu.clock_mem) == (25, 25.0, 500, 1249)  # pwm 64/255; pp_dpm *
    assert (gpu.pcie_link_speed, gpu.pcie_link_speed_max) == (2.5, 16.0)  # an idle link slows down
    # unique_id 0: no UUID (ROCm has none either); jobs name it by its bus id.
    assert gpu.uuid is None and gpu.ref == "00000000:03:00.0" and gpu.vendor_index == 0
    (unnamed,) = backend(fake_kernel, pci_ids=(str(tmp_path / "absent"),)).sample().gpus
    assert unnamed.name == "AMD GPU 1002:744c"
    assert card.address == "0000:03:00.0"


def test_an_older_kernel_lacks_files_and_those_values_are_null(fake_kernel):
    hwmon = {k: v for k, v in MI210_HWMON.items() if not k.endswith("_label") and not k.startswith("freq")}
    fake_kernel.sys.amd(drop=OLD_KERNEL_DROPS, hwmon=hwmon)
    (gpu,) = fake_kernel.snapshot()["gpus"]
    assert gpu["state"] == "ok" and gpu["name"] == "AMD GPU 1002:740f"  # no product_name, no pci.ids here
    assert gpu["temperature"] == 45  # temp1 is the edge sensor, labelled or not
    assert gpu["temperature_junction"] is None and gpu["utilization_memory"] is None and gpu["uuid"] is None
    assert gpu["pcie_link_speed"] is None and gpu["pcie_link_width"] == 16
    assert (gpu["clock_sm"], gpu["clock_mem"]) == (1700, 1600)  # from pp_dpm_*, without hwmon's freq files


def test_a_bmc_display_adapter_and_nvidia_nodes_are_not_cards(fake_kernel):
    fake_kernel.sys.bmc()
    fake_kernel.sys.add("0000:41:00.0", "nvidia", {"vendor": "0x10de", "device": "0x2330", "class": "0x030200"})
    out = fake_kernel.run("snapshot", "--json")
    assert out.returncode == 3 and "no AMD or Intel GPU under" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1
    fake_kernel.sys.amd()
    assert [g["vendor"] for g in fake_kernel.snapshot()["gpus"]] == ["amd"]


def test_a_suspended_card_is_asleep_and_not_woken(fake_kernel):
    """Every file of the sleeping card but its runtime PM status is a FIFO that would hang its
    reader (the card would then be "stale"): the card staying "ok" shows none was opened."""
    awake = fake_kernel.sys.amd()
    asleep = fake_kernel.sys.amd("0000:43:00.0", parents=("pci0000:40", "0000:40:01.1"))
    fifos = fake_kernel.sys.suspend(asleep)
    assert any("hwmon" in str(f) for f in fifos) and any(f.name == "gpu_busy_percent" for f in fifos)
    out = fake_kernel.run("snapshot", "--json", timeout=30)
    assert out.returncode == 0, out.stderr
    first, second = json.loads(out.stdout)["gpus"]
    assert first["asleep"] is False and first["utilization_gpu"] == 37
    assert second["asleep"] is True and second["state"] == "ok"
    assert all(second[k] is None for k in ("utilization_gpu", "memory_used", "temperature", "power_draw", "uuid"))
    table = fake_kernel.run("snapshot", timeout=30)
    assert "ASLEEP" in table.stdout and "not read, so as not to wake it" in table.stdout

    # It wakes up (a job started on it): now it is read, its identity too.
    clock = Clock()
    drm = backend(fake_kernel, clock)
    assert drm.sample().gpus[1].asleep is True
    for fifo in fifos:
        fifo.unlink()
    for name, text in MI210.items():
        write(asleep.device / name, text)
    for name, text in MI210_HWMON.items():
        write(asleep.hwmon / name, text)
    woken = drm.sample().gpus[1]
    assert woken.asleep is False and woken.utilization_gpu == 37 and woken.uuid == "GPU-5a2c1e8172f8a8b6"
    assert awake.address != asleep.address


def test_a_card_unplugged_mid_run_is_lost_and_comes_back(fake_kernel):
    first = fake_kernel.sys.amd()
    fake_kernel.sys.amd("0000:43:00.0", files=RX7900, hwmon=RX7900_HWMON, parents=("pci0000:40",))
    clock = Clock()
    drm = backend(fake_kernel, clock)
    assert [g.state for g in drm.sample().gpus] == ["ok", "ok"]
    fake_kernel.sys.unplug(first)
    lost, other = drm.sample().gpus
    assert (lost.index, lost.state, lost.name) == (0, "lost", "AMD Instinct MI210") and "gone from" in lost.error
    assert (other.index, other.state, other.utilization_gpu) == (1, "ok", 3)
    assert drm.topology().left_out == ((0, "gone from sysfs"),)
    fake_kernel.sys.cards.remove(first)
    fake_kernel.sys.amd(number=5)  # back, at the same address, under another cardN
    assert drm.sample().gpus[0].state == "lost"  # noticed at the next look for cards
    clock.now += DISCOVER_S
    back, _ = drm.sample().gpus
    assert (back.index, back.state, back.utilization_gpu) == (0, "ok", 37)


def test_i915_and_xe_cards(fake_kernel):
    i915 = fake_kernel.sys.intel("0000:03:00.0", driver="i915")
    xe = fake_kernel.sys.intel("0000:83:00.0", driver="xe", parents=("pci0000:80",))
    pid = os.getpid()
    kernel_proc = fake_kernel.proc
    kernel_proc.client(pid, 20, i915_fdinfo(i915.address, 3, render_ns=0, local_kib=1024), node="renderD128")
    kernel_proc.client(pid, 21, xe_fdinfo(xe.address, 9, rcs_cycles=0, total_cycles=0, vram_kib=4096),
                       node="renderD129")
    clock = Clock()
    drm = backend(fake_kernel, clock)
    a, b = drm.sample().gpus
    assert [(g.vendor, g.vendor_index, g.uuid) for g in (a, b)] == [("intel", 0, None), ("intel", 1, None)]
    assert (a.clock_sm, a.power_limit, a.power_draw, a.utilization_gpu) == (2000, 190.0, None, None)
    assert (b.clock_sm, b.memory_total, b.memory_used, b.temperature, b.temperature_memory, b.power_limit) == (
        2850, 12 * GIB, None, 61, 70, 250.0)
    assert a.processes[0].gpu_memory == 1 << 20 and b.processes[0].gpu_memory == 4 << 20
    # Two seconds later: 30 J more on i915's counter; xe's card counter 200 J more, its package's 900 J.
    clock.now += 2.0
    fake_kernel.sys.set_hwmon(i915, "energy1_input", str(int(I915_HWMON["energy1_input"]) + 30_000_000))
    fake_kernel.sys.set_hwmon(xe, "energy1_input", str(5_000_000_000 + 200_000_000))
    fake_kernel.sys.set_hwmon(xe, "energy2_input", str(9_000_000_000 + 900_000_000))
    kernel_proc.client(pid, 20, i915_fdinfo(i915.address, 3, render_ns=500_000_000, local_kib=1024))
    kernel_proc.client(pid, 21, xe_fdinfo(xe.address, 9, rcs_cycles=300, total_cycles=1000, vram_kib=4096))
    a, b = drm.sample().gpus
    assert (a.power_draw, a.utilization_gpu, a.processes[0].sm_util) == (15.0, 25, 25)
    assert (b.power_draw, b.utilization_gpu, b.processes[0].sm_util) == (100.0, 30, 30)  # the card's, not pkg's


@pytest.mark.parametrize("mount", ["/dev/dri", "/host/dev/dri"])
def test_mixed_nvidia_and_amd_host_lists_both(fake_driver, fake_kernel, mount):
    """The fake NVIDIA driver's two cards keep their NVML indices; the AMD card follows."""
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", bus="00000000:07:00.0"),
                                 Card("NVIDIA A100-SXM4-80GB", bus="00000000:0F:00.0")]
    fake_driver.write()
    for address in ("0000:07:00.0", "0000:0f:00.0"):  # nvidia-drm's nodes are there too, and are skipped
        fake_kernel.sys.add(address, "nvidia", {"vendor": "0x10de", "device": "0x20b2", "class": "0x030200"},
                            parents=("pci0000:00", "0000:00:01.1"), number=7 if address.endswith("7:00.0") else 8)
    amd = fake_kernel.sys.amd("0000:c3:00.0", parents=("pci0000:c0", "0000:c0:01.1"))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        fake_kernel.proc.client(sleeper.pid, 5, amdgpu_fdinfo(amd.address, 4, vram_kib=2 << 20), dev=mount)
        doc = fake_kernel.snapshot(env=fake_driver.env)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert doc["backend"] == "nvml" and doc["driver_version"]
    assert [(g["index"], g["vendor"]) for g in doc["gpus"]] == [(0, "nvidia"), (1, "nvidia"), (2, "amd")]
    (proc,) = doc["gpus"][2]["processes"]
    # The AMD card's process, with what the OS says of it, like an NVIDIA card's.
    assert proc["pid"] == sleeper.pid and proc["gpu_memory"] == 2 * GIB and proc["type"] == "compute"
    assert "time.sleep(60)" in proc["command"] and proc["user"] and proc["rss"] > 0
    topo = fake_kernel.run("topo", "--json", env=fake_driver.env)
    assert topo.returncode == 0, topo.stderr
    rows = {g["index"]: g["links"] for g in json.loads(topo.stdout)["gpus"]}
    assert rows[0]["2"] == "NODE" and rows[2]["0"] == "NODE" and rows[2]["2"] == "X"  # other host bridges


def test_roots_from_the_config_file(fake_kernel, tmp_path):
    fake_kernel.sys.amd()
    config = tmp_path / "config.toml"
    config.write_text(f'[paths]\nsysfs = "{fake_kernel.sys.root}"\nprocfs = "{fake_kernel.proc.root}"\n')
    out = subprocess.run([sys.executable, "-m", "gpumon", "snapshot", "--json", "--config", str(config)],
                         env=fake_kernel.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert '"vendor": "amd"' in out.stdout
    config.write_text('[paths]\nsysfs = 3\n')
    bad = subprocess.run([sys.executable, "-m", "gpumon", "snapshot", "--config", str(config)],
                         env=fake_kernel.env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "'paths.sysfs' must be str" in bad.stderr


def test_no_card_of_any_vendor_is_exit_3_naming_where_it_looked(fake_kernel):
    out = fake_kernel.run("snapshot")
    assert out.returncode == 3 and "Traceback" not in out.stderr
    assert f"no AMD or Intel GPU under {fake_kernel.sys.root}/class/drm" in out.stderr and "--demo" in out.stderr



def test_topo_places_amd_cards_on_pcie_and_in_their_xgmi_hive(fake_kernel):
    up = ("pci0000:00", "0000:00:01.1", "0000:01:00.0")  # a root port, a PCIe switch's upstream port
    hive = {"xgmi_hive_info/xgmi_hive_id": "1234567890abcdef"}
    a = fake_kernel.sys.amd("0000:03:00.0", files={**MI210, **hive}, parents=(*up, "0000:02:00.0"), numa=0)
    fake_kernel.sys.amd("0000:04:00.0", files={**MI210, **hive}, parents=(*up, "0000:02:04.0"), numa=0)
    fake_kernel.sys.amd("0000:07:00.0", parents=(*up, "0000:02:08.0", "0000:05:00.0", "0000:06:00.0"), numa=0)
    fake_kernel.sys.amd("0000:81:00.0", parents=("pci0000:80", "0000:80:01.1"), numa=1)
    fake_kernel.sys.amd("0000:03:00.1", files={**MI210, "unique_id": "1"}, parents=(*up, "0000:02:00.0"), numa=0)
    out = fake_kernel.run("topo", "--json")
    assert out.returncode == 0, out.stderr
    rows = {g["index"]: g for g in json.loads(out.stdout)["gpus"]}  # indices in PCI order: 03.0 03.1 04 07 81
    assert rows[0]["links"]["2"] == "XGMI"  # one hive: xGMI, over their PCIe switch
    assert rows[0]["links"]["1"] == "PIX"  # behind the same switch, not in the hive
    assert rows[2]["links"]["3"] == "PXB" and rows[3]["links"]["4"] == "SYS" and rows[0]["links"]["4"] == "SYS"
    assert (rows[4]["numa_node"], rows[0]["cpu_affinity"]) == (1, "0-7")
    text = fake_kernel.run("topo")
    assert "XGMI" in text.stdout and "xGMI hive" in text.stdout and a.address == "0000:03:00.0"


def test_topo_says_it_does_not_know_the_hive_of_a_sleeping_card(fake_kernel):
    """A card asleep is not read (its files hang here, as a read would wake a real one), so which
    xGMI hive it is in is not known: topo says so rather than showing it on PCIe alone."""
    up = ("pci0000:00", "0000:00:01.1", "0000:01:00.0")
    hive = {"xgmi_hive_info/xgmi_hive_id": "1234567890abcdef"}
    fake_kernel.sys.amd("0000:03:00.0", files={**MI210, **hive}, parents=(*up, "0000:02:00.0"), numa=0)
    asleep = fake_kernel.sys.amd("0000:04:00.0", files={**MI210, **hive}, parents=(*up, "0000:02:04.0"), numa=0)
    radeon = fake_kernel.sys.amd("0000:43:00.0", files=RX7900, hwmon=RX7900_HWMON, parents=("pci0000:40",))
    fake_kernel.sys.suspend(asleep)
    fake_kernel.sys.suspend(radeon)  # asleep too, but in no hive: its links are all PCIe, and known
    out = fake_kernel.run("topo", "--json", "--timeout", "2", timeout=30)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["left_out"] == [] and [g["index"] for g in doc["gpus"]] == [0, 1, 2]
    assert doc["gpus"][0]["links"]["1"] == "PIX"  # what its PCIe path says; xGMI not known
    assert doc["unknown"] == [{"index": 1, "reason": "asleep: its xGMI links are not known (reading them "
                                                     "would wake it)"}]
    # A fleet host's `t` reads the same document over ssh.
    assert topology_from_remote(doc).unknown == ((1, doc["unknown"][0]["reason"]),)
    text = fake_kernel.run("topo", "--timeout", "2", timeout=30)
    assert text.returncode == 0, text.stderr
    assert "GPU1 asleep: its xGMI links are not known (reading them would wake it)\n" in text.stdout
    assert "GPU2 asleep" not in text.stdout
