"""Fake kernel trees for AMD and Intel cards: a sysfs and a procfs written as the kernel lays them out.

Written from the kernel's documentation (Documentation/gpu/amdgpu/driver-misc.rst and thermal.rst,
Documentation/gpu/drm-usage-stats.rst, the i915/xe sysfs and hwmon ABI, hwmon/sysfs-interface):

    <sys>/devices/pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0/   the card's PCI device
        vendor device class subsystem_* numa_node local_cpulist driver -> <sys>/bus/pci/drivers/amdgpu
        power/runtime_status  current_link_speed ... gpu_busy_percent mem_info_* pp_dpm_* unique_id ...
        ras/{features,umc_err_count,...,gpu_vram_bad_pages}   (boards with RAS: Instinct)
        hwmon/hwmon3/{name,temp1_input,temp1_label,power1_average,...}
        drm/card1/{device -> ../.., gt/gt0/...}   drm/renderD128/device -> ../..
    <sys>/class/drm/card1 -> ../../devices/.../drm/card1
    <sys>/bus/pci/devices/0000:03:00.0 -> ../../../devices/.../0000:03:00.0

    <proc>/<pid>/fd/<n> -> /dev/dri/renderD128     <proc>/<pid>/fdinfo/<n>     (drm-* keys)
    <proc>/<pid>/{stat,status,cmdline} -> /proc/<real pid>/...  (a real process, so psutil has one)

A card "older kernel" lacks the files newer kernels added; a suspended card's amdgpu and hwmon
files are FIFOs: a reader that opens one hangs (its card is then reported "stale"), so a sleeping
card that stays "ok" proves none was opened. `hang` makes one file such a FIFO on an awake card: to
userspace, a read the kernel never finishes (a hung SMU) looks just like it.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

GIB = 1 << 30
MIB = 1 << 20

# What amdgpu writes for an Instinct MI210 on a recent kernel.
MI210 = {
    "vendor": "0x1002", "device": "0x740f", "class": "0x038000", "subsystem_vendor": "0x1002",
    "subsystem_device": "0x0c34", "gpu_busy_percent": "37", "mem_busy_percent": "12",
    "mem_info_vram_total": str(64 * GIB), "mem_info_vram_used": str(3 * GIB),
    "mem_info_vis_vram_total": str(64 * GIB), "mem_info_gtt_total": str(128 * GIB), "mem_info_gtt_used": str(20 * MIB),
    "pp_dpm_sclk": "0: 500Mhz \n1: 800Mhz \n2: 1700Mhz *\n", "pp_dpm_mclk": "0: 400Mhz \n1: 1600Mhz *\n",
    "current_link_speed": "16.0 GT/s PCIe", "current_link_width": "16", "max_link_speed": "32.0 GT/s PCIe",
    "max_link_width": "16", "unique_id": "5a2c1e8172f8a8b6", "vbios_version": "113-D67301-063",
    "product_name": "AMD Instinct MI210", "serial_number": "692231000131",
    "power_dpm_force_performance_level": "auto", "power/runtime_status": "active",
}
# Its RAS files (drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c, Documentation/gpu/amdgpu/ras.rst): the
# blocks with RAS on (mask bits by ras_block_string: umc 0, sdma 1, gfx 2, mmhub 3, pcie_bif 5,
# hdp 6, xgmi_wafl 7), an error count file each, and the bad pages (none yet). A Radeon has no ras/.
RAS_BLOCKS = ("umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp", "xgmi_wafl")
MI210_RAS = {"ras/features": "feature mask: 0xef", **{f"ras/{block}_err_count": "ue: 0\nce: 0" for block in RAS_BLOCKS},
             "ras/gpu_vram_bad_pages": ""}
MI210.update(MI210_RAS)
MI210_HWMON = {
    "name": "amdgpu", "temp1_input": "45000", "temp1_label": "edge", "temp2_input": "52000", "temp2_label": "junction",
    "temp3_input": "48000", "temp3_label": "mem", "power1_average": "123000000", "power1_cap": "300000000",
    "power1_label": "PPT", "freq1_input": "1700000000", "freq1_label": "sclk", "freq2_input": "1600000000",
    "freq2_label": "mclk",
}
# A Radeon RX 7900 XTX: no board name file, a fan, and power1_input (newer kernels, SMU 13).
RX7900 = {
    "vendor": "0x1002", "device": "0x744c", "class": "0x030000", "subsystem_vendor": "0x1002",
    "subsystem_device": "0x0e3b", "gpu_busy_percent": "3", "mem_busy_percent": "1",
    "mem_info_vram_total": str(24 * GIB), "mem_info_vram_used": str(512 * MIB),
    "mem_info_gtt_total": str(32 * GIB), "mem_info_gtt_used": str(64 * MIB),
    "pp_dpm_sclk": "0: 500Mhz *\n1: 2500Mhz \n", "pp_dpm_mclk": "0: 96Mhz \n1: 1249Mhz *\n",
    "current_link_speed": "2.5 GT/s PCIe", "current_link_width": "16", "max_link_speed": "16.0 GT/s PCIe",
    "max_link_width": "16", "unique_id": "0000000000000000", "vbios_version": "113-D70401-00",
    "power_dpm_force_performance_level": "auto", "power/runtime_status": "active",
}
RX7900_HWMON = {
    "name": "amdgpu", "temp1_input": "38000", "temp1_label": "edge", "temp2_input": "41000", "temp2_label": "junction",
    "temp3_input": "50000", "temp3_label": "mem", "power1_input": "25000000", "power1_cap": "327000000",
    "fan1_input": "0", "pwm1": "64", "pwm1_max": "255", "pwm1_enable": "2",
}
# The same card on a 5.4 kernel: no mem_busy_percent, no unique_id, no labels, no freq files.
OLD_KERNEL_DROPS = ("mem_busy_percent", "unique_id", "product_name", "serial_number", "current_link_speed",
                    "max_link_speed")
INTEL_DG2 = {
    "vendor": "0x8086", "device": "0x56a0", "class": "0x030000", "subsystem_vendor": "0x8086",
    "subsystem_device": "0x1020", "current_link_speed": "2.5 GT/s PCIe", "current_link_width": "1",
    "max_link_speed": "2.5 GT/s PCIe", "max_link_width": "1", "power/runtime_status": "active",
}
I915_CARD = {"gt_act_freq_mhz": "2000", "gt_cur_freq_mhz": "2050", "gt_max_freq_mhz": "2400",
             "gt/gt0/rps_act_freq_mhz": "2000", "gt/gt0/rps_cur_freq_mhz": "2050", "gt/gt0/rps_max_freq_mhz": "2400"}
I915_HWMON = {"name": "i915", "energy1_input": "1000000000", "power1_max": "190000000", "power1_crit": "400000000",
              "in0_input": "1000"}
XE_BMG = {
    "vendor": "0x8086", "device": "0xe20b", "class": "0x030000", "subsystem_vendor": "0x8086",
    "subsystem_device": "0x1100", "power/runtime_status": "active",
    "tile0/physical_vram_size_bytes": str(12 * GIB), "tile0/gt0/freq0/act_freq": "2850",
    "tile0/gt0/freq0/cur_freq": "2850", "tile0/gt0/freq0/max_freq": "2850",
}
XE_HWMON = {"name": "xe", "energy1_input": "5000000000", "energy1_label": "card", "energy2_input": "9000000000",
            "energy2_label": "pkg", "power1_max": "250000000", "power1_label": "card", "power2_max": "300000000",
            "power2_label": "pkg", "temp2_input": "61000", "temp2_label": "pkg", "temp3_input": "70000",
            "temp3_label": "vram"}


@dataclass
class FakeCard:
    address: str
    card: str
    render: str
    device: Path  # its PCI device's directory
    hwmon: Path | None

    @property
    def drm(self) -> Path:
        return self.device / "drm" / self.card


@dataclass
class FakeSysfs:
    root: Path
    cards: list[FakeCard] = field(default_factory=list)

    def __post_init__(self) -> None:
        for sub in ("class/drm", "bus/pci/devices", "devices"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        (self.root / "class" / "drm" / "version").write_text("drm 1.1.0 20060810\n")

    def add(self, address: str, driver: str, files: dict[str, str], hwmon: dict[str, str] | None = None,
            card_files: dict[str, str] | None = None, parents: tuple[str, ...] = ("pci0000:00",),
            numa: int = -1, cpus: str = "0-7", number: int | None = None, drop: tuple[str, ...] = ()) -> FakeCard:
        """A PCI device bound to `driver`, with a DRM card and render node. `parents`: the host
        bridge and the bridges above it, top first."""
        number = len(self.cards) + 1 if number is None else number  # card0 is often the BMC's
        device = self.root / "devices" / Path(*parents) / address
        device.mkdir(parents=True)
        base = {"numa_node": str(numa), "local_cpulist": cpus, **files}
        for name, text in base.items():
            if name not in drop:
                write(device / name, text)
        drivers = self.root / "bus" / "pci" / "drivers" / driver
        drivers.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(drivers, device), device / "driver")
        os.symlink(os.path.relpath(device, self.root / "bus/pci/devices"), self.root / "bus/pci/devices" / address)
        hwmon_dir = None
        if hwmon is not None:
            hwmon_dir = device / "hwmon" / f"hwmon{number + 1}"
            for name, text in hwmon.items():
                if name not in drop:
                    write(hwmon_dir / name, text)
        fake = FakeCard(address, f"card{number}", f"renderD{127 + number}", device, hwmon_dir)
        for node in (fake.card, fake.render):
            (device / "drm" / node).mkdir(parents=True)
            os.symlink("../..", device / "drm" / node / "device")
            os.symlink(os.path.relpath(device / "drm" / node, self.root / "class/drm"), self.root / "class/drm" / node)
        for name, text in (card_files or {}).items():
            write(fake.drm / name, text)
        self.cards.append(fake)
        return fake

    def amd(self, address: str = "0000:03:00.0", files: dict[str, str] = MI210, hwmon=MI210_HWMON,
            **options) -> FakeCard:
        parents = options.pop("parents", ("pci0000:00", "0000:00:01.1", "0000:01:00.0", "0000:02:00.0"))
        return self.add(address, "amdgpu", dict(files), dict(hwmon) if hwmon else None, parents=parents, **options)

    def intel(self, address: str = "0000:00:02.0", driver: str = "i915", **options) -> FakeCard:
        if driver == "xe":
            return self.add(address, "xe", dict(XE_BMG), dict(XE_HWMON), **options)
        return self.add(address, "i915", dict(INTEL_DG2), dict(I915_HWMON), card_files=dict(I915_CARD), **options)

    def bmc(self, address: str = "0000:c1:00.0") -> FakeCard:
        """A server's BMC display adapter (ast): a VGA controller, not a GPU."""
        return self.add(address, "ast", {"vendor": "0x1a03", "device": "0x2000", "class": "0x030000"}, number=0)

    def set(self, card: FakeCard, name: str, value: str) -> None:
        write(card.device / name, value)

    def set_hwmon(self, card: FakeCard, name: str, value: str) -> None:
        assert card.hwmon is not None
        write(card.hwmon / name, value)

    def suspend(self, card: FakeCard) -> list[Path]:
        """The kernel put the card to sleep: every amdgpu and hwmon file becomes a FIFO that hangs
        whoever opens it (a real read would wake the card). Returns the FIFOs."""
        write(card.device / "power" / "runtime_status", "suspended")
        keep = {"vendor", "device", "class", "subsystem_vendor", "subsystem_device", "numa_node", "local_cpulist"}
        fifos = []
        files = [p for p in card.device.iterdir() if p.is_file() and not p.is_symlink() and p.name not in keep]
        files += [p for p in (card.device / "ras").iterdir()] if (card.device / "ras").is_dir() else []
        files += [p for p in card.hwmon.iterdir()] if card.hwmon else []
        for path in files:
            path.unlink()
            os.mkfifo(path)
            fifos.append(path)
        return fifos

    def hang(self, card: FakeCard, name: str, hwmon: bool = False) -> HungFile:
        """From now on a read of the card's file `name` (of its hwmon directory with `hwmon`) hangs
        until the test releases it."""
        assert card.hwmon is not None or not hwmon
        path = (card.hwmon if hwmon else card.device) / name
        path.unlink()
        os.mkfifo(path)
        return HungFile(path)

    def unplug(self, card: FakeCard) -> None:
        """Hot-unplugged: its class/drm links and its device directory are gone."""
        for node in (card.card, card.render):
            (self.root / "class" / "drm" / node).unlink()
        (self.root / "bus" / "pci" / "devices" / card.address).unlink()
        shutil.rmtree(card.device)


@dataclass
class HungFile:
    """A sysfs file whose reads hang: a FIFO nobody writes, so open() blocks."""

    path: Path

    def release(self, text: str, timeout: float = 15.0) -> bool:
        """The hung read returns `text`, and the file reads normally again. False when no reader was
        waiting within `timeout` (nothing was stuck on it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:  # succeeds only while a reader waits in open(): never blocks the test
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                break
            except OSError as exc:
                if exc.errno != errno.ENXIO or time.monotonic() > deadline:
                    self.path.unlink()
                    write(self.path, text)
                    return False
                time.sleep(0.05)
        self.path.unlink()  # readers from now on find a plain file
        write(self.path, text)
        os.write(fd, (text + "\n").encode())
        os.close(fd)  # the waiting reader gets the text, then the end of the file
        return True


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") or not text else text + "\n")  # an empty file stays empty


def bad_page(pfn: int, flag: str) -> str:
    """A line of gpu_vram_bad_pages: "gpu pfn : gpu page size : flags" (R reserved, P pending, F failed)."""
    return f"0x{pfn:08x} : 0x{4096:08x} : {flag}\n"


def amdgpu_fdinfo(address: str, client: int, vram_kib: int, gfx_ns: int = 0, compute_ns: int = 0,
                  legacy: bool = False) -> str:
    """What amdgpu writes (6.x; `legacy`: 5.x's drm-memory-vram form)."""
    lines = ["pos:\t0", "flags:\t02100002", "mnt_id:\t26", "ino:\t1049", "drm-driver:\tamdgpu",
             f"drm-client-id:\t{client}", f"drm-pdev:\t{address}", "pasid:\t32771"]
    if legacy:
        lines += [f"drm-memory-vram:\t{vram_kib} KiB", "drm-memory-gtt: \t2048 KiB", "drm-memory-cpu: \t0 KiB"]
    else:
        lines += [f"drm-total-vram:\t{vram_kib} KiB", f"drm-resident-vram:\t{vram_kib} KiB",
                  "drm-total-gtt:\t2048 KiB", "drm-resident-gtt:\t2048 KiB", "amd-evicted-vram:\t0 KiB"]
    lines += [f"drm-engine-gfx:\t{gfx_ns} ns", f"drm-engine-compute:\t{compute_ns} ns", "drm-engine-dma:\t0 ns"]
    return "\n".join(lines) + "\n"


def i915_fdinfo(address: str, client: int, render_ns: int, local_kib: int = 0) -> str:
    return "\n".join([
        "pos:\t0", "flags:\t02100002", "drm-driver:\ti915", f"drm-client-id:\t{client}", f"drm-pdev:\t{address}",
        f"drm-total-local0:\t{local_kib} KiB", f"drm-resident-local0:\t{local_kib} KiB",
        f"drm-engine-render:\t{render_ns} ns", "drm-engine-copy:\t0 ns", "drm-engine-video:\t0 ns",
        "drm-engine-capacity-video:\t2", "drm-engine-video-enhance:\t0 ns"]) + "\n"


def xe_fdinfo(address: str, client: int, rcs_cycles: int, total_cycles: int, vram_kib: int = 0) -> str:
    return "\n".join([
        "pos:\t0", "flags:\t02100002", "drm-driver:\txe", f"drm-client-id:\t{client}", f"drm-pdev:\t{address}",
        f"drm-total-vram0:\t{vram_kib} KiB", f"drm-resident-vram0:\t{vram_kib} KiB", "drm-total-gtt:\t4 KiB",
        f"drm-cycles-rcs:\t{rcs_cycles}", f"drm-total-cycles-rcs:\t{total_cycles}", "drm-cycles-bcs:\t0",
        f"drm-total-cycles-bcs:\t{total_cycles}", "drm-engine-capacity-ccs:\t4"]) + "\n"


@dataclass
class FakeProcfs:
    root: Path

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for name in ("stat", "uptime", "meminfo", "cpuinfo"):  # what psutil reads of the machine
            if not (self.root / name).exists():
                os.symlink(f"/proc/{name}", self.root / name)

    def process(self, pid: int, real_pid: int | None = None) -> Path:
        """Process `pid` of the fake tree, whose stat, status and cmdline are those of the real
        process `real_pid` (the same pid by default)."""
        base = self.root / str(pid)
        if not base.exists():
            (base / "fd").mkdir(parents=True)
            (base / "fdinfo").mkdir()
            for name in ("stat", "status", "cmdline", "statm", "cgroup"):
                os.symlink(f"/proc/{real_pid or pid}/{name}", base / name)
        return base

    def client(self, pid: int, fd: int, fdinfo: str, node: str = "renderD128", dev: str = "/dev/dri",
               real_pid: int | None = None) -> None:
        """An open DRM file: fd/N links to the device node, fdinfo/N says the client's usage."""
        base = self.process(pid, real_pid)
        link = base / "fd" / str(fd)
        if not link.is_symlink():
            os.symlink(f"{dev}/{node}", link)
        write(base / "fdinfo" / str(fd), fdinfo)

    def other_file(self, pid: int, fd: int, target: str) -> None:
        base = self.process(pid)
        os.symlink(target, base / "fd" / str(fd))
        write(base / "fdinfo" / str(fd), "pos:\t0\nflags:\t02\nmnt_id:\t1\nino:\t5\n")

    def close(self, pid: int, fd: int) -> None:
        base = self.root / str(pid)
        (base / "fd" / str(fd)).unlink()
        (base / "fdinfo" / str(fd)).unlink()

    def exit(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))


class FakeKernel:
    """A fake sysfs and procfs for one test, and the real gpumon run against them (no NVIDIA driver
    unless `env` brings the fake one)."""

    def __init__(self, tmp: Path) -> None:
        self.sys = FakeSysfs(tmp / "sys")
        self.proc = FakeProcfs(tmp / "proc")
        self.no_nvidia = str(tmp / "no-nvidia" / "libnvidia-ml.so.1")

    @property
    def paths(self) -> list[str]:
        return ["--path.sysfs", str(self.sys.root), "--path.procfs", str(self.proc.root)]

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, GPUMON_NVML_LIB=self.no_nvidia)

    def argv(self, *args: str) -> list[str]:
        """gpumon SUBCOMMAND --path.sysfs … --path.procfs … REST (the paths before any `--`)."""
        if args and not args[0].startswith("-"):
            return [sys.executable, "-m", "gpumon", args[0], *self.paths, *args[1:]]
        return [sys.executable, "-m", "gpumon", *self.paths, *args]

    def run(self, *args: str, timeout: float = 60, env: dict[str, str] | None = None,
            **kwargs) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env=env or self.env, capture_output=True, text=True,
                              timeout=timeout, **kwargs)

    def snapshot(self, env: dict[str, str] | None = None) -> dict:
        out = self.run("snapshot", "--json", env=env)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


@pytest.fixture
def fake_kernel(tmp_path: Path) -> FakeKernel:
    return FakeKernel(tmp_path / "kernel")
