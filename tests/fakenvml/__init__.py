"""Build and configure the fake libnvidia-ml.so.1 that the tests load through nvidia-ml-py.

A test describes its machine with `FakeMachine` (cards, processes, links, faults), writes it to a
config file, and points gpumon at the compiled library with `--nvml-lib` or `GPUMON_NVML_LIB`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

SOURCE = Path(__file__).with_name("fake_nvml.c")
GIB = 1 << 30


class CompilerMissing(RuntimeError):
    pass


def build(out_dir: Path, omit: tuple[str, ...] = ()) -> Path:
    """Compile the fake driver; `omit` names NVML functions the library must not export."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise CompilerMissing("no C compiler (cc/gcc) on PATH")
    key = hashlib.sha256(SOURCE.read_bytes() + "\0".join(sorted(omit)).encode()).hexdigest()[:12]
    lib_dir = out_dir / f"fakenvml-{key}"
    lib = lib_dir / "libnvidia-ml.so.1"
    if lib.exists():
        return lib
    lib_dir.mkdir(parents=True, exist_ok=True)
    # pytest-xdist's workers share `out_dir`: one compiles while the others wait on the lock, and
    # the library appears whole (compiled aside, then renamed), never half-written.
    with open(lib_dir / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if lib.exists():
            return lib
        partial = lib_dir / f"libnvidia-ml.so.1.{os.getpid()}"
        cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(partial), str(SOURCE), "-lpthread"]
        if omit:
            # A version script hides exported symbols: to the bindings the function is absent,
            # exactly like an older driver that predates it.
            script = lib_dir / "omit.map"
            script.write_text("{ global: *; local: " + "; ".join(omit) + "; };\n")
            cmd.insert(1, f"-Wl,--version-script={script}")
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        os.replace(partial, lib)
    return lib


@dataclass
class Card:
    name: str = "NVIDIA A100-SXM4-40GB"
    uuid: str | None = None
    bus: str | None = None
    mem_total: int = 40 * GIB
    extra: dict[str, object] = field(default_factory=dict)

    def line(self, index: int) -> str:
        uuid = self.uuid or f"GPU-{index:08x}-aaaa-bbbb-cccc-{index:012x}"
        bus = self.bus or f"00000000:{0x10 + index:02X}:00.0"
        parts = [f'name="{self.name}"', f"uuid={uuid}", f"bus={bus}", f"mem_total={self.mem_total}"]
        parts += [f"{k}={v}" for k, v in self.extra.items()]
        return "gpu " + " ".join(parts)


@dataclass
class FakeMachine:
    cards: list[Card] = field(default_factory=list)
    procs: list[dict[str, object]] = field(default_factory=list)
    links: list[tuple[int, int, int]] = field(default_factory=list)
    nvlinks: list[tuple[int, int, int]] = field(default_factory=list)
    xids: list[dict[str, object]] = field(default_factory=list)
    delays: dict[str, int] = field(default_factory=dict)
    driver: str = "550.54.15"
    cuda: int = 12040
    init_error: int = 0
    topo_default: int = 50
    scan_env: bool = False  # real processes pinned by CUDA_VISIBLE_DEVICES=<a card's UUID> are its processes
    scan_env_ignore: tuple[str, ...] = ()  # ... except these programs (comm), which never open a card
    count_error: int = 0  # nvmlDeviceGetCount fails with this NVML code
    driver_unloaded: bool = False  # the kernel driver is gone (a reload in progress)
    nvswitches: int = 4  # NVSwitch chips the cards' switch_links go to
    fabric_info_max: int = 3  # newest nvmlGpuFabricInfo struct version the driver knows

    def render(self) -> str:
        lines = [f"driver {self.driver}", f"cuda {self.cuda}", f"topo_default {self.topo_default}",
                 f"nvswitches {self.nvswitches}", f"fabric_info_max {self.fabric_info_max}"]
        if self.init_error:
            lines.append(f"init_error {self.init_error}")
        if self.scan_env:
            lines.append("scan_env 1")
        if self.scan_env_ignore:
            lines.append("scan_env_ignore " + ",".join(self.scan_env_ignore))
        if self.count_error:
            lines.append(f"count_error {self.count_error}")
        if self.driver_unloaded:
            lines.append("driver_unloaded 1")
        lines += [f"delay {fn} {ms}" for fn, ms in self.delays.items()]
        lines += [card.line(i) for i, card in enumerate(self.cards)]
        lines += ["proc " + " ".join(f"{k}={v}" for k, v in p.items()) for p in self.procs]
        lines += [f"link {a} {b} {level}" for a, b, level in self.links]
        lines += [f"nvlink {a} {b} {n}" for a, b, n in self.nvlinks]
        lines += ["xid " + " ".join(f"{k}={v}" for k, v in x.items()) for x in self.xids]
        return "\n".join(lines) + "\n"

    def write(self, path: Path) -> Path:
        # Atomic replace: the library re-reads the file while gpumon runs.
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.render())
        os.replace(tmp, path)
        return path
