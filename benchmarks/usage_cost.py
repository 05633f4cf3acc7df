#!/usr/bin/env python3
"""What keeping the usage ledger adds to a sample pass: 8 cards of the fake driver, 64
and 512 real processes, as they come (one user) and spread over 64 Slurm jobs of 16 users.

Per pass: the sampler's pass itself (NVML + psutil enrichment, as the TUI and a recording watch do);
HolderTracker.update as it was before the ledger (the module from git's 16fef6b^, loaded beside) and
now, with each holder's per-card shares; MinuteBook.add (the minute's sums, in memory); and the
writer thread's transaction of a minute's rows into a real ledger file, spread over the minute's 60
samples (it runs in its own thread, off the pass, but it is CPU all the same).

Run from the repo root: `python benchmarks/usage_cost.py`. Needs a C compiler and git.
Printed, not asserted: timings on shared machines are noisy.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fakenvml import build  # noqa: E402
from sampler_cost import in_jobs, sampled  # noqa: E402

BEFORE = "16fef6b^"  # the commit before the ledger


def tracker_before(workdir: Path):
    """The HolderTracker before the ledger (git's copy); today's where that commit is not here."""
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{BEFORE}:gpumon/owners/holders.py"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        print(f"(no {BEFORE} in this checkout: 'tracker before' is today's tracker)")
        from gpumon.owners.holders import HolderTracker
        return HolderTracker
    source = shown.stdout
    path = workdir / "holders_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("holders_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["holders_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.HolderTracker


def per_pass(fn, items) -> float:
    start = time.process_time()
    for item in items:
        fn(item)
    return (time.process_time() - start) / len(items)


def measure(procs, passes: int, workdir: Path, lib: Path, Before) -> list[tuple]:
    from gpumon.owners.holders import HolderTracker
    from gpumon.usage.ledger import connect
    from gpumon.usage.minutes import MinuteBook
    from gpumon.usage.store import Ids, write_minute

    snapshots, pass_cost = sampled(8, procs, passes, workdir, lib, "usage")
    out = []
    for shape, shaped in (("one user", snapshots), ("64 jobs", [in_jobs(s) for s in snapshots])):
        # Times step 1 s a sample, so a minute fills and the book hands it over, as at 1 Hz.
        timed = [dataclasses.replace(s, time=1_000_000.0 + i) for i, s in enumerate(shaped)]
        # The best of 5 fresh trackers each (this machine's CPU time varies by +-15 % run to run).
        before = min(per_pass(Before().update, timed) for _ in range(5))
        now = min(per_pass(HolderTracker().update, timed) for _ in range(5))
        tracker = HolderTracker()
        held = [tracker.update(s) for s in timed]
        adds = []
        for _ in range(5):
            clock = iter(range(10 ** 9))
            book = MinuteBook(60.0, clock=lambda: float(next(clock)))
            start = time.process_time()
            for s, h in zip(timed, held):
                book.add(s, h)
            adds.append((time.process_time() - start) / len(timed))
        add = min(adds)
        minute = book.take()
        db = workdir / f"usage-{len(procs)}-{shape.replace(' ', '')}.sqlite"
        conn = connect(db, write=True)
        ids = Ids()  # the writer's, kept across its minutes
        start = time.process_time()
        for n in range(20):
            write_minute(conn, dataclasses.replace(minute, start=minute.start + 60 * (n + 1)), ids)
        write = (time.process_time() - start) / 20 / 60  # a transaction a minute, over 60 samples
        conn.close()
        out.append((len(procs), shape, pass_cost, before, now, add, write, len(minute.holders)))
    return out


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gpumon-bench-usage-"))
    lib = build(workdir)
    Before = tracker_before(workdir)
    pool = [subprocess.Popen(["sleep", "600"]) for _ in range(512)]
    try:
        print("8 cards; ms CPU per sample (pass: NVML + psutil enrichment). The ledger's part: the")
        print("tracker's per-card shares (now - before), the minute's sums, the writer's transaction / 60.")
        print(f"{'procs':>5} {'holders':>9} {'pass':>7} {'tracker before':>15} {'now':>7} {'book':>7} "
              f"{'write/60':>9} {'ledger +%':>10} {'rows/min':>9}")
        for nprocs in (64, 512):
            for n, shape, pass_cost, before, now, add, write, rows in measure(pool[:nprocs], 60, workdir, lib,
                                                                              Before):
                ledger = (now - before) + add + write
                print(f"{n:>5} {shape:>9} {pass_cost * 1e3:>7.2f} {before * 1e3:>15.3f} {now * 1e3:>7.3f} "
                      f"{add * 1e3:>7.3f} {write * 1e3:>9.4f} {100 * ledger / (pass_cost + before):>10.1f} {rows:>9}")
    finally:
        for p in pool:
            p.kill()


if __name__ == "__main__":
    main()
