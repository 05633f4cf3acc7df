"""Simulated GPUs for machines without a driver (`--demo [SCENARIO]`), for trying gpumon,
screenshots and UI tests. Values move plausibly and depend only on the seed and the sample
number, so a run is repeatable. Its pids are made up: `real_pids` is False, so nothing ever
looks them up or signals them.
"""

from __future__ import annotations

import dataclasses
import math
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpumon.cards.backends.base import Backend
from gpumon.errors import UsageError
from gpumon.health.history import HealthTracker
from gpumon.health.rules import HealthSettings
from gpumon.model import GpuSample, ProcessOwner, ProcessSample, Snapshot, Topology
from gpumon.vendors import DEFAULT_VENDOR

GIB = 1 << 30


@dataclass(frozen=True)
class _KernelCard:
    """What the kernel's driver tells of a card it reads (the DRM backend's view), where NVML would
    tell more: no P-states, throttle reasons, ECC or PCIe rates."""

    uuid: bool  # a unique id of its own (amdgpu's, in ROCm's form)
    busy_memory: bool  # memory in use and the memory controller's load
    junction: bool  # a junction (hotspot) temperature
    memory_clock: bool
    perf_level: str | None
    vbios: str | None


AMDGPU = _KernelCard(uuid=True, busy_memory=True, junction=True, memory_clock=True, perf_level="auto",
                     vbios="113-M3000100-102")
XE = _KernelCard(uuid=False, busy_memory=False, junction=False, memory_clock=False, perf_level=None, vbios=None)


@dataclass(frozen=True)
class _CardSpec:
    name: str
    memory_gib: int
    power_limit: float
    max_sm: int
    max_mem_clock: int
    ecc: bool = True  # a datacenter card: ECC, HBM (with its temperature), row remapping
    fan: bool = False
    vendor: str = DEFAULT_VENDOR
    gpm: bool = False  # Hopper: GPM metrics
    kernel: _KernelCard | None = None  # read through the kernel (AMD, Intel); None: through NVML
    pair_link: tuple[str, int] = ("NV12", 12)  # a datacenter pair's link: its word, its NVLinks


@dataclass(frozen=True)
class _JobSpec:
    card: int
    pid: int
    user: str
    command: str
    memory_gib: float
    load: float  # 0..1: how busy the card is while this job runs
    kind: str = "compute"
    owner: ProcessOwner | None = None


A100 = _CardSpec("NVIDIA A100-SXM4-80GB", 80, 400.0, 1410, 1593)
RTX3090 = _CardSpec("NVIDIA GeForce RTX 3090", 24, 350.0, 1695, 9751, ecc=False, fan=True)
RTX4090 = _CardSpec("NVIDIA GeForce RTX 4090", 24, 450.0, 2520, 10501, ecc=False, fan=True)
H100 = _CardSpec("NVIDIA H100 80GB HBM3", 80, 700.0, 1980, 2619, gpm=True)
MI300X = _CardSpec("AMD Instinct MI300X", 192, 750.0, 2100, 1300, vendor="amd", kernel=AMDGPU, pair_link=("XGMI", 0))
ARC = _CardSpec("Intel Arc A770", 16, 225.0, 2400, 2187, ecc=False, fan=True, vendor="intel", kernel=XE)

_SLURM_JOB = ProcessOwner("slurm", "4242.0", "llama-7b", "alice")
_TRAINING = [
    _JobSpec(0, 48213, "alice", "python train.py --model llama-7b --batch-size 32", 61.5, 0.95, owner=_SLURM_JOB),
    _JobSpec(1, 48214, "alice", "python train.py --model llama-7b --batch-size 32 --rank 1", 60.8, 0.93,
             owner=_SLURM_JOB),
    # A notebook kernel holding memory while nobody computes: the users view's idle holder.
    _JobSpec(2, 51877, "bob", "jupyter-kernel --ip=127.0.0.1 -f kernel-3a1f.json", 9.2, 0.0,
             owner=ProcessOwner("user", "bob", None, "bob")),
    _JobSpec(2, 52904, "carol", "python -m vllm.entrypoints.openai.api_server --model mistral-7b", 34.0, 0.55,
             owner=ProcessOwner("container", "3f2a9c0d1e2b", "vllm-mistral", "carol", "docker")),
]

SCENARIOS: dict[str, tuple[list[_CardSpec], list[_JobSpec]]] = {
    "default": ([A100] * 4, _TRAINING),
    "workstation": (
        [RTX3090, RTX4090],
        [
            _JobSpec(0, 1834, "root", "/usr/lib/xorg/Xorg vt2 -displayfd 3", 0.4, 0.03, "graphics",
                     ProcessOwner("unit", "display-manager.service", None, "root")),
            _JobSpec(0, 2210, "dana", "/usr/bin/gnome-shell", 0.3, 0.02, "graphics",
                     ProcessOwner("unit", "session-2.scope", None, "dana")),
            _JobSpec(1, 30211, "dana", "python diffusion.py --steps 50 --fp16", 17.5, 0.88, "compute",
                     ProcessOwner("unit", "app-kitty-2231.scope", None, "dana")),
        ],
    ),
    "hot": ([H100] * 2, [
        _JobSpec(0, 7001, "erin", "torchrun --nproc 1 pretrain.py", 70.0, 0.9, owner=ProcessOwner(
            "k8s", "5f0c1d2e-3b4a-4c5d-8e6f-7a8b9c0d1e2f", "ml/pretrain-7f9c6d-x2x4q (trainer)", "erin")),
        _JobSpec(1, 7002, "erin", "python eval.py --suite full", 22.0, 0.98, owner=ProcessOwner(
            "k8s", "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d", "ml/eval-5b8d4 (eval)", "erin")),
    ]),
    "lost": ([A100] * 4, _TRAINING),
    # NVIDIA, AMD and Intel cards on one host (read through NVML and the kernel).
    "mixed": ([H100, H100, MI300X, MI300X, ARC],
              [_JobSpec(0, 61200, "frank", "torchrun --nproc 2 train.py --model llama-13b", 71.0, 0.92),
               _JobSpec(1, 61201, "frank", "torchrun --nproc 2 train.py --model llama-13b --rank 1", 70.2, 0.9),
               _JobSpec(2, 63410, "grace", "python -m vllm.entrypoints.openai.api_server --model mixtral", 150.0, 0.6),
               _JobSpec(4, 2291, "henry", "python encode.py --codec av1", 3.1, 0.35)]),
}
LOST_AFTER_SAMPLES = 15  # scenario "lost": card 2 falls off the bus after this many samples
DRIVER, CUDA = "550.54.15", "12.4"


class DemoBackend(Backend):
    name = "demo"
    real_pids = False

    def __init__(self, scenario: str = "default", seed: int = 0, cards: int | None = None,
                 clock: Callable[[], float] = time.time, health: HealthSettings = HealthSettings()) -> None:
        if scenario not in SCENARIOS:
            raise UsageError(f"unknown demo scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
        self.scenario = scenario
        self.seed = seed
        specs, jobs = SCENARIOS[scenario]
        count = cards if cards is not None else len(specs)
        # More cards than the scenario has (stress tests, benchmarks) repeat its pattern.
        self.specs = [specs[i % len(specs)] for i in range(count)]
        self.jobs_by_card = [
            [
                dataclasses.replace(j, card=i, pid=j.pid + 1000 * (i // len(specs)))
                for j in jobs if j.card == i % len(specs)
            ]
            for i in range(count)
        ]
        self.step = 0
        self.clock = clock
        self.started = clock()
        self.host = "demo-" + socket.gethostname()
        self.health = HealthTracker(health)
        self._energy = [0.0] * count  # joules since "the driver loaded" (the demo's start)

    def sample(self) -> Snapshot:
        self.step += 1
        now = self.clock()  # once a sample: screenshots and tests run the demo on a ticking clock
        gpus = tuple(self._card(i, spec, now) for i, spec in enumerate(self.specs))
        return Snapshot(
            time=now, host=self.host, backend=self.name,
            driver_version=DRIVER, cuda_driver_version=CUDA, gpus=gpus,
        )

    def _uuid(self, index: int) -> str:
        rng = random.Random(f"{self.seed}-uuid-{index}")
        h = "%032x" % rng.getrandbits(128)
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"

    def _vendor_identity(self, index: int, spec: _CardSpec) -> dict:
        """AMD and Intel cards: ROCm's UUID form (Intel has none), the card's number in its runtime."""
        kernel = spec.kernel
        if kernel is None:
            return dict(uuid=self._uuid(index))
        number = sum(1 for s in self.specs[:index] if s.vendor == spec.vendor)
        uuid = f"GPU-{random.Random(f'{self.seed}-amd-{index}').getrandbits(64):016x}" if kernel.uuid else None
        return dict(uuid=uuid, vendor=spec.vendor, vendor_index=number, vbios=kernel.vbios,
                    pcie_link_speed=32.0, pcie_link_width=16,
                    pcie_link_speed_max=32.0, pcie_link_width_max=16, asleep=False)

    def _card(self, index: int, spec: _CardSpec, now: float) -> GpuSample:
        identity = dict(
            index=index, name=spec.name, **self._vendor_identity(index, spec),
            pci_bus_id=f"00000000:{[0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD][index % 8]:02X}:00.0",
            numa_node=0 if index < max(1, len(self.specs) // 2) else 1,
            cpu_affinity=self._cpu_affinity(index),
        )
        if self.scenario == "lost" and index == 2 and self.step > LOST_AFTER_SAMPLES:
            verdict = self.health.card(identity["uuid"], "lost", now)[1]  # type: ignore[arg-type]
            return GpuSample(**identity, state="lost", error="GPU is lost", health=verdict)
        rng = random.Random(f"{self.seed}-{index}-{self.step}")
        wave = 0.5 + 0.5 * math.sin(self.step / 9.0 + index)
        jobs = self.jobs_by_card[index]
        load = min(1.0, sum(j.load for j in jobs))
        util = int(max(0, min(100, load * 100 * (0.85 + 0.15 * wave) + rng.uniform(-4, 4)))) if jobs else 0
        used = int(sum(j.memory_gib for j in jobs) * GIB) + 480 * (1 << 20)
        total = spec.memory_gib * GIB
        hot = self.scenario == "hot" and index == 0
        temp = 34 + 48 * util / 100 + rng.uniform(-1, 1)
        if hot:
            temp = min(93.0, 70 + self.step * 1.5)
        power = spec.power_limit * (0.15 + 0.8 * util / 100) + rng.uniform(-5, 5)
        throttle: tuple[str, ...] = () if util else ("gpu_idle",)
        clock_sm = int(spec.max_sm * (0.95 if util else 0.15))
        if hot and temp >= 85:
            throttle = ("sw_thermal", "hw_thermal")
            clock_sm = int(spec.max_sm * 0.6)
        if util > 90 and power > spec.power_limit * 0.9:
            throttle = throttle + ("sw_power_cap",)
        processes = tuple(
            ProcessSample(
                pid=j.pid, type=j.kind, gpu_memory=int(j.memory_gib * GIB),
                sm_util=int(min(100, j.load * util)), user=j.user, command=j.command,
                cpu_percent=round(100 * j.load * (0.8 + 0.4 * rng.random()), 1),
                rss=int((2 + 6 * j.load) * GIB), started=self.started - 3600 * (1 + j.pid % 7), owner=j.owner,
            )
            for j in jobs
        )
        if (kernel := spec.kernel) is not None:  # what the kernel gives
            return GpuSample(
                **identity, utilization_gpu=util, utilization_memory=int(util * 0.6) if kernel.busy_memory else None,
                memory_total=total, memory_used=used if kernel.busy_memory else None,
                memory_free=total - used if kernel.busy_memory else None, temperature=int(temp),
                temperature_junction=int(temp + 9) if kernel.junction else None,
                temperature_memory=int(temp + 4), fan=int(30 + 0.6 * util) if spec.fan else None,
                power_draw=round(min(power, spec.power_limit), 1), power_limit=spec.power_limit,
                clock_sm=clock_sm, clock_mem=spec.max_mem_clock if kernel.memory_clock else None,
                perf_level=kernel.perf_level, processes=processes)
        power = round(min(power, spec.power_limit), 1)
        self._energy[index] += power
        raw = self._counters(spec, index, util, int(temp), power)
        counters, verdict = self.health.card(identity["uuid"], "ok", now, raw, None,  # type: ignore[arg-type]
                                             0 if spec.ecc else None)
        return GpuSample(
            **identity, counters=counters, health=verdict,
            utilization_gpu=util, utilization_memory=int(util * 0.6),
            memory_total=total, memory_used=used, memory_free=total - used,
            temperature=int(temp), fan=int(30 + 0.6 * util) if spec.fan else None,
            power_draw=power, power_limit=spec.power_limit,
            clock_sm=clock_sm, clock_mem=spec.max_mem_clock, pstate="P0" if util else "P8",
            throttle_reasons=throttle, ecc_errors_uncorrected=0 if spec.ecc else None,
            pcie_tx=int(util * 1.2e8), pcie_rx=int(util * 2.5e8),
            encoder_util=0, decoder_util=0, processes=processes,
        )

    def _counters(self, spec: _CardSpec, index: int, util: int, temp: int, power: float) -> dict[str, Any]:
        hbm = spec.ecc
        return dict(
            remapped_rows_correctable=0 if hbm else None, remapped_rows_uncorrectable=0 if hbm else None,
            remapped_rows_pending=False if hbm else None, remapped_rows_failure=False if hbm else None,
            ecc_errors_corrected=0 if hbm else None, pcie_replay_counter=0,
            memory_temperature=temp + 4 if hbm else None, memory_temperature_max=95 if hbm else None,
            energy_j=round(self._energy[index], 1), energy_source="driver",
            sm_active=round(util * 0.8, 1) if spec.gpm else None,
            tensor_active=round(util * 0.45, 1) if spec.gpm else None,
            dram_active=round(util * 0.3, 1) if spec.gpm else None,
        )

    def _cpu_affinity(self, index: int) -> str:
        half = max(1, len(self.specs) // 2)
        return "0-31,64-95" if index < half else "32-63,96-127"

    def topology(self) -> Topology:
        n = len(self.specs)
        half = max(1, n // 2)
        links: list[list[str | None]] = []
        nvlinks: list[list[int]] = []
        for i in range(n):
            row, nv = [], []
            for j in range(n):
                if i == j:
                    row.append("X")
                    nv.append(0)
                elif i // 2 == j // 2 and self.specs[i].ecc and self.specs[i].vendor == self.specs[j].vendor:
                    word, count = self.specs[i].pair_link  # datacenter cards: NVLink (or xGMI) pairs
                    row.append(word)
                    nv.append(count)
                elif (i < half) == (j < half):
                    row.append("NODE")
                    nv.append(0)
                else:
                    row.append("SYS")
                    nv.append(0)
            links.append(row)
            nvlinks.append(nv)
        return Topology(
            indices=tuple(range(n)), links=tuple(map(tuple, links)), nvlinks=tuple(map(tuple, nvlinks)),
            cpu_affinity=tuple(self._cpu_affinity(i) for i in range(n)),
            numa_node=tuple(0 if i < half else 1 for i in range(n)),
        )



BACKEND = DemoBackend
