#!/usr/bin/env python3
"""A year of usage history, and how fast `gpumon report` answers from it.

Builds a year ending now of one host: 8 cards, 20 users, Slurm jobs of about 6 h (normal, sd 1.5 h,
30 min at least) with gaps of about 1 h (exponential) between them, each minute a card is held
two holder rows (the user's and the job's) and every minute a card row: 7.2 M holder-minutes and
4.2 M card-minutes, written through the ledger's own path (`store.write_minutes`, a day a
transaction) and rolled up as the writer does (`store.roll_up`, minutes past `keep_minutes`,
after each day), then `prune` as at a start. Prints the build time, the file's size and its rows,
then each report's time: in the process (`ledger_report`, what the page's section costs) and as
the real `gpumon report --json` command (the interpreter's start included), the best of 3.

Run from the repo root: `python benchmarks/usage_year.py [--days 365] [--keep-minutes 2d]
[--ledger PATH]` (an existing PATH is reused: the build is skipped). Printed, not asserted.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumon.units import parse_duration  # noqa: E402
from gpumon.usage import store  # noqa: E402
from gpumon.usage.ledger import connect  # noqa: E402
from gpumon.usage.minutes import CardMinute, Minute  # noqa: E402
from gpumon.usage.report import ledger_report  # noqa: E402
from gpumon.usage.settings import HistorySettings  # noqa: E402

HOST = "bench-host"
CARDS = 8
USERS = [f"user{n:02d}" for n in range(20)]
GIB = 2 ** 30


def card_timelines(start: int, end: int, rng: random.Random) -> list[list[tuple[int, int, str, int, int, int]]]:
    """Per card, its jobs: (from, to, user, job id, SM %, memory)."""
    job = 100000
    out = []
    for _ in range(CARDS):
        jobs = []
        t = start + int(rng.expovariate(1 / 3600)) // 60 * 60
        while t < end:
            length = max(1800, int(rng.gauss(6 * 3600, 1.5 * 3600))) // 60 * 60
            job += 1
            jobs.append((t, t + length, rng.choice(USERS), job, rng.choice((0, 20, 60, 85, 95)),
                         rng.randrange(2, 80) * GIB))
            t += length + int(rng.expovariate(1 / 3600)) // 60 * 60
        out.append(jobs)
    return out


def day_minutes(day_start: int, timelines, cursors: list[int]) -> list[Minute]:
    minutes = []
    uuids = [f"GPU-bench{n:04d}-0000-4000-8000-000000000000" for n in range(CARDS)]
    for start in range(day_start, day_start + 86400, 60):
        minute = Minute(start)
        for index in range(CARDS):
            jobs = timelines[index]
            while cursors[index] < len(jobs) and jobs[cursors[index]][1] <= start:
                cursors[index] += 1
            held = cursors[index] < len(jobs) and jobs[cursors[index]][0] <= start
            card = minute.cards[HOST, uuids[index]] = CardMinute(index, "NVIDIA A100-SXM4-80GB", 60.0)
            card.util_known_s = 60.0
            if not held:
                card.energy_j = 60.0 * 60
                continue
            _, _, user, job, sm, memory = jobs[cursors[index]]
            power = 100.0 + 3 * sm
            card.util_s, card.energy_j, card.held_s, card.busy_s = sm * 60.0, power * 60, 60.0, 60.0 if sm else 0.0
            parts = [60.0, sm * 60.0, 60.0, memory * 60.0, memory, power * 60, 0.0 if sm else 60.0]
            minute.holders[HOST, uuids[index], "user", user] = [index, user, user, *parts]
            minute.holders[HOST, uuids[index], "slurm", str(job)] = [index, f"job {job}", user, *parts]
        minutes.append(minute)
    return minutes


def build(path: Path, days: int, keep_minutes_s: float, now: float) -> None:
    rng = random.Random(52)
    end = int(now // 86400 * 86400)
    start = end - days * 86400
    timelines = card_timelines(start, end + 86400, rng)
    cursors = [0] * CARDS
    conn = connect(path, write=True)
    ids = store.Ids()
    began = time.monotonic()
    holder_rows = card_rows = 0
    for day in range(days + 1):
        day_start = start + day * 86400
        minutes = [m for m in day_minutes(day_start, timelines, cursors) if m.start < now]
        holder_rows += sum(len(m.holders) for m in minutes)
        card_rows += sum(len(m.cards) for m in minutes)
        store.write_minutes(conn, minutes, ids)
        store.roll_up(conn, min(now, day_start + 86400) - keep_minutes_s)
        if day % 30 == 0:
            print(f"  day {day}/{days}: {time.monotonic() - began:.0f} s", flush=True)
    store.prune(conn, now - (days + 1) * 86400)
    conn.close()
    print(f"built {days} days in {time.monotonic() - began:.0f} s: {holder_rows / 1e6:.1f} M holder-minutes, "
          f"{card_rows / 1e6:.1f} M card-minutes written")


def best(fn, tries: int = 3) -> float:
    times = []
    for _ in range(tries):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--keep-minutes", default="2d")
    parser.add_argument("--ledger", type=Path)
    args = parser.parse_args()
    keep_minutes_s = parse_duration(args.keep_minutes, "--keep-minutes", above_zero=True)
    workdir = Path(tempfile.mkdtemp(prefix="gpumon-bench-year-"))
    path = args.ledger or workdir / "usage.sqlite"
    now = time.time()
    if not path.exists():
        build(path, args.days, keep_minutes_s, now)
    with sqlite3.connect(path) as conn:
        counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                  for t in ("holder_minutes", "holder_hours", "card_minutes", "card_hours", "holders", "cards")}
    print(f"{path}: {path.stat().st_size / 2 ** 20:.0f} MiB; " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
    settings = HistorySettings(path, keep_s=400 * 86400.0, keep_minutes_s=keep_minutes_s)
    config = workdir / "config.toml"
    config.write_text(f'[history]\npath = "{path}"\nkeep = "400d"\n')
    env = {**os.environ, "GPUMON_CONFIG": str(config)}
    print(f"{'report':<26} {'in process':>11} {'gpumon report':>14}")
    for since, by in ((365, "user"), (365, "job"), (365, "card"), (365, "day"), (7, "user"), (1, "user")):
        inside = best(lambda: ledger_report(settings, now - since * 86400, now, by))
        command = [sys.executable, "-m", "gpumon", "report", "--json", "--since", f"{since}d", "--by", by]
        outside = best(lambda: subprocess.run(command, env=env, check=True, capture_output=True))
        print(f"{f'--since {since}d --by {by}':<26} {inside:>10.2f}s {outside:>13.2f}s")
    start = best(lambda: subprocess.run([sys.executable, "-c", "import gpumon.cli.report"], check=True, cwd=ROOT))
    print(f"{'(python, importing report)':<26} {'':>11} {start:>13.2f}s")


if __name__ == "__main__":
    main()
