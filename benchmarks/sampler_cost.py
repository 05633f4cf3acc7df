#!/usr/bin/env python3
"""CPU time of one sampler pass (NVML via the fake driver + psutil enrichment) by cards and processes.

Shows that the cost per sample grows about linearly with cards and processes. Run from the repo
root: `python benchmarks/sampler_cost.py`. Needs a C compiler (builds the test suite's fake driver).
Printed, not asserted: timings on shared machines are noisy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fakenvml import GIB, Card, FakeMachine, build  # noqa: E402


def spawn_idle(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sleep", "600"]) for _ in range(count)]


def measure(cards: int, procs: list[subprocess.Popen], passes: int, workdir: Path, lib: Path) -> float:
    from gpumon.monitor.backends.nvml import NvmlBackend
    from gpumon.monitor.sampler import Sampler

    machine = FakeMachine(
        cards=[Card(extra=dict(util="10..90", temp="40..80", power_mw="100000..300000")) for _ in range(cards)],
        procs=[dict(gpu=i % cards, pid=p.pid, mem=GIB, sm="0..100") for i, p in enumerate(procs)],
    )
    config = workdir / f"bench-{cards}-{len(procs)}.conf"
    machine.write(config)
    os.environ["FAKE_NVML_CONFIG"] = str(config)
    backend = NvmlBackend(lib_path=str(lib))
    sampler = Sampler(backend)
    sampler.collect()  # warm the caches, as in a long-running monitor
    start = time.process_time()
    for _ in range(passes):
        sampler.collect()
    cost = (time.process_time() - start) / passes
    backend.close()
    return cost


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gpumon-bench-"))
    lib = build(workdir)
    pool = spawn_idle(512)
    try:
        print(f"{'cards':>5} {'procs':>5} {'ms CPU/sample':>14} {'us per card+proc':>17}")
        for cards, nprocs in [(1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (8, 64), (8, 128), (8, 256), (8, 512)]:
            cost = measure(cards, pool[:nprocs], passes=20, workdir=workdir, lib=lib)
            print(f"{cards:>5} {nprocs:>5} {cost * 1000:>14.2f} {cost * 1e6 / (cards + nprocs):>17.0f}")
    finally:
        for p in pool:
            p.kill()


if __name__ == "__main__":
    main()
