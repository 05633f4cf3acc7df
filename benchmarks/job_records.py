#!/usr/bin/env python3
"""What reading the job list costs as finished jobs pile up: `list_jobs()` (every record of every
job, what the J screen read each second) against `JobsReader.read()` again (a stat per job, the
unfinished ones read), and how many are left after `prune_old` with the default `[jobs] keep`.

Run from the repo root: `python benchmarks/job_records.py [--jobs 100 500]`. Uses a state
folder of its own (XDG_STATE_HOME in a temporary directory). Printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def timed(work, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[100, 500])
    args = parser.parse_args()
    print("| finished jobs | list_jobs() | JobsReader.read() again | left after prune_old (keep 200, 30 days) |")
    print("|---|---|---|---|")
    for count in args.jobs:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["XDG_STATE_HOME"] = tmp
            from gpumon.jobs import records
            from gpumon.jobs.files import write_atomic
            from gpumon.jobs.jobs_reader import JobsReader

            records.configure_keep(10**9, 10**12)  # made without pruning
            now = time.time()
            for n in range(count):
                spec = records.JobSpec(id=f"20260101-000000-{n:05x}", name=f"job{n}", command=["true"],
                                       gpu_spec="0", cwd="/", created=now - count + n)
                directory = records.create_job(spec)
                write_atomic(directory / "exit.json", json.dumps(
                    {"state": "exited", "exit_code": 0, "signal": None, "ended": now - count + n + 1, "reason": None}))
            reader = JobsReader()
            reader.read()
            full, again = timed(records.list_jobs), timed(reader.read)
            records.configure_keep(200, 30 * 86400.0)
            records.prune_old()
            print(f"| {count} | {full:.1f} ms | {again:.1f} ms | {len(records.list_jobs())} |")


if __name__ == "__main__":
    main()
