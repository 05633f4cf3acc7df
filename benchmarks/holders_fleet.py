#!/usr/bin/env python3
"""Who holds the cards across a fleet: the cost of one interval of HolderTracker.update (every host
once, as `gpumon users --hosts`, the fleet's users view and the idle rule feed it) by hosts and
processes per host. Flat per host and process: linear in hosts x processes (it was quadratic in
hosts: each update scanned every host's processes).

Run from the repo root: `python benchmarks/holders_fleet.py [--hosts 16 64 256] [--processes 40]`.
Printed, not asserted: timings on shared machines are noisy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpumon.model import GpuSample, ProcessSample, Snapshot  # noqa: E402
from gpumon.owners.holders import HolderTracker  # noqa: E402

CARDS = 8


def snapshot(host: str, processes: int, now: float) -> Snapshot:
    per_card = max(1, processes // CARDS)
    gpus = []
    for index in range(CARDS):
        procs = tuple(ProcessSample(pid=1000 + index * per_card + i, type="compute", gpu_memory=1 << 30,
                                    sm_util=(i % 3) * 10, user=f"user{i % 5}", started=1000.0 + i)
                      for i in range(per_card))
        gpus.append(GpuSample(index=index, uuid=f"GPU-{host}-{index}", name="NVIDIA A30", pci_bus_id=None,
                              power_draw=150.0, processes=procs))
    return Snapshot(time=now, host=host, backend="nvml", driver_version=None, cuda_driver_version=None,
                    gpus=tuple(gpus))


def per_interval(hosts: int, processes: int, intervals: int = 10) -> float:
    """Milliseconds per interval (every host updated once), the median of `intervals`."""
    tracker = HolderTracker()
    names = [f"gpu{i:04d}" for i in range(hosts)]
    times = []
    for k in range(intervals + 1):
        docs = [snapshot(name, processes, 2000.0 + k) for name in names]  # built outside the timing
        started = time.perf_counter()
        for name, doc in zip(names, docs):
            tracker.update(doc, name)
        if k:  # the first interval meets every process for the first time
            times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--processes", type=int, nargs="+", default=[40])
    args = parser.parse_args()
    print("| hosts | processes per host | ms per interval | µs per host and process |")
    print("|---|---|---|---|")
    for processes in args.processes:
        for hosts in args.hosts:
            ms = per_interval(hosts, processes)
            print(f"| {hosts} | {processes} | {ms:.1f} | {ms * 1000 / (hosts * processes):.2f} |")


if __name__ == "__main__":
    main()
