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

from gpumon.errors import UsageError
from gpumon.model import GpuSample, ProcessSample, Snapshot, Topology
from gpumon.monitor.health_history import HealthTracker

GIB = 1 << 30


@dataclass(frozen=True)
class _CardSpec:
    name: str
    memory_gib: int
    power_limit: float
    max_sm: int
    max_mem_clock: int
    ecc: bool = True  # a datacenter card: ECC, HBM (with its temperature), row remapping
    fan: bool = False
    gpm: bool = False  # Hopper: GPM metrics


@dataclass(frozen=True)
class _JobSpec:
    card: int
    pid: int
    user: str
    command: str
    memory_gib: float
    load: float  # 0..1: how busy the card is while this job runs
    kind: str = "compute"


A100 = _CardSpec("NVIDIA A100-SXM4-80GB", 80, 400.0, 1410, 1593)
RTX3090 = _CardSpec("NVIDIA GeForce RTX 3090", 24, 350.0, 1695, 9751, ecc=False, fan=True)
RTX4090 = _CardSpec("NVIDIA GeForce RTX 4090", 24, 450.0, 2520, 10501, ecc=False, fan=True)
H100 = _CardSpec("NVIDIA H100 80GB HBM3", 80, 700.0, 1980, 2619, gpm=True)

_TRAINING = [
    _JobSpec(0, 48213, "alice", "python train.py --model llama-7b --batch-size 32", 61.5, 0.95),
    _JobSpec(1, 48214, "alice", "python train.py --model llama-7b --batch-size 32 --rank 1", 60.8, 0.93),
    _JobSpec(2, 51877, "bob", "jupyter-kernel --ip=127.0.0.1 -f kernel-3a1f.json", 9.2, 0.12),
    _JobSpec(2, 52904, "carol", "python -m vllm.entrypoints.openai.api_server --model mistral-7b", 34.0, 0.55),
]

SCENARIOS: dict[str, tuple[list[_CardSpec], list[_JobSpec]]] = {
    "default": ([A100] * 4, _TRAINING),
    "workstation": (
        [RTX3090, RTX4090],
        [
            _JobSpec(0, 1834, "root", "/usr/lib/xorg/Xorg vt2 -displayfd 3", 0.4, 0.03, "graphics"),
            _JobSpec(0, 2210, "dana", "/usr/bin/gnome-shell", 0.3, 0.02, "graphics"),
            _JobSpec(1, 30211, "dana", "python diffusion.py --steps 50 --fp16", 17.5, 0.88),
        ],
    ),
    "hot": ([H100] * 2, [_JobSpec(0, 7001, "erin", "torchrun --nproc 1 pretrain.py", 70.0, 0.9),
                        _JobSpec(1, 7002, "erin", "python eval.py --suite full", 22.0, 0.98)]),
    "lost": ([A100] * 4, _TRAINING),
}
LOST_AFTER_SAMPLES = 15  # scenario "lost": card 2 falls off the bus after this many samples
DRIVER, CUDA = "550.54.15", "12.4"


class DemoBackend:
    name = "demo"
    real_pids = False

    def __init__(self, scenario: str = "default", seed: int = 0, cards: int | None = None,
                 clock: Callable[[], float] = time.time) -> None:
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
        self.health = HealthTracker()
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

    def _card(self, index: int, spec: _CardSpec, now: float) -> GpuSample:
        identity = dict(
            index=index, uuid=self._uuid(index), name=spec.name,
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
                rss=int((2 + 6 * j.load) * GIB), started=self.started - 3600 * (1 + j.pid % 7),
            )
            for j in jobs
        )
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
                elif i // 2 == j // 2 and self.specs[i].ecc:  # datacenter cards: NVLink pairs
                    row.append("NV12")
                    nv.append(12)
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

    def close(self) -> None:
        pass
