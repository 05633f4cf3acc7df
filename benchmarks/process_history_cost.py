#!/usr/bin/env python3
"""What keeping each process's recent past (cards/process_history.py, the process screen's charts)
adds to a sample: 8 cards of the fake driver, 16, 64, 128 and 512 real processes.

Per sample: the sampler's pass itself (NVML + psutil enrichment), and ProcessHistory.add on its
snapshot (one point a second: the snapshots are a second apart here, so every one adds a point).
Then the memory the tracks hold once full (600 points each; at most 128 processes are tracked).

Run from the repo root: `python benchmarks/process_history_cost.py`. Needs a C compiler.
Printed, not asserted: timings on shared machines are noisy.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fakenvml import build  # noqa: E402
from sampler_cost import sampled  # noqa: E402

PASSES = 30


def main() -> None:
    from gpumon.cards.process_history import ProcessHistory

    workdir = Path(tempfile.mkdtemp(prefix="gpumon-bench-"))
    lib = build(workdir)
    pool = [subprocess.Popen(["sleep", "600"]) for _ in range(512)]
    try:
        print(f"{'procs':>5} {'pass ms':>8} {'history ms':>11} {'+%':>6} {'tracked':>8} {'full KiB':>9}")
        for nprocs in (16, 64, 128, 512):
            snapshots, pass_cost = sampled(8, pool[:nprocs], PASSES, workdir, lib, "history")
            snapshots = [dataclasses.replace(s, time=1000.0 + i) for i, s in enumerate(snapshots)]
            history = ProcessHistory()
            history.add(snapshots[0])
            best = float("inf")
            for _ in range(5):
                start = time.process_time()
                for i, snapshot in enumerate(snapshots):
                    history.add(dataclasses.replace(snapshot, time=snapshot.time + (_ + 1) * PASSES))
                best = min(best, (time.process_time() - start) / PASSES)
            for i in range(history.capacity):  # fill every track
                history.add(dataclasses.replace(snapshots[0], time=10_000.0 + i))
            full = history.capacity * 5 * 8 * len(history) / 1024
            print(f"{nprocs:>5} {pass_cost * 1000:>8.2f} {best * 1000:>11.3f} {best / pass_cost * 100:>6.1f} "
                  f"{len(history):>8} {full:>9.0f}")
    finally:
        for proc in pool:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
