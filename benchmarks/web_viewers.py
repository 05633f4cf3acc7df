#!/usr/bin/env python3
"""What `gpumon serve` costs with 1 and with 50 open pages: the server's CPU (psutil, user + system
of its process) over a fixed time, against the fake driver, each page a Server-Sent Events stream
read by an aiohttp client in this process (so the readers' CPU is not counted).

    python benchmarks/web_viewers.py                 # 8 cards, 64 processes, 30 s each
    python benchmarks/web_viewers.py --seconds 10 --viewers 1 10 50
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fakenvml import build  # noqa: E402
from scenario import env_for, machine  # noqa: E402


def cpu_seconds(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


async def _read(url: str, count: int, seconds: float, pid: int) -> tuple[float, int]:
    """Open `count` streams, then (server CPU seconds, events received) over `seconds`."""
    import aiohttp

    received = 0

    async def stream(session: aiohttp.ClientSession) -> None:
        nonlocal received
        async with session.get(url) as response:
            async for line in response.content:
                if line.startswith(b"data: "):
                    received += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        tasks = [asyncio.create_task(stream(session)) for _ in range(count)]
        await asyncio.sleep(2.0)  # every stream open and served once
        cpu0, got0 = cpu_seconds(pid), received
        await asyncio.sleep(seconds)
        cpu1, got1 = cpu_seconds(pid), received
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return cpu1 - cpu0, got1 - got0


def measure(python: str, env: dict[str, str], viewers: list[int], seconds: float, interval: float) -> None:
    proc = subprocess.Popen([python, "-m", "gpumon", "serve", "--listen", "127.0.0.1:0", "--interval", str(interval)],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        found = re.search(r"http://\S+/", proc.stdout.readline())
        if not found:
            raise SystemExit("gpumon serve printed no URL")
        time.sleep(3.0)  # start-up is not the steady state
        idle0 = cpu_seconds(proc.pid)
        time.sleep(seconds)
        idle = cpu_seconds(proc.pid) - idle0
        print(f"  no page open: cpu {100 * idle / seconds:.1f} % ({idle:.2f} s over {seconds:g} s)")
        for count in viewers:
            cpu, events = asyncio.run(_read(found.group(0) + "events", count, seconds, proc.pid))
            print(f"  {count:>3} page{'s' if count > 1 else ' '} open: cpu {100 * cpu / seconds:.1f} % "
                  f"({cpu:.2f} s over {seconds:g} s; {events / seconds:.0f} events/s sent)")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def web_cost(work: Path, lib: Path, python: str, cards: int, pids: list[int], seconds: float,
             viewers: list[int] = (1, 50), interval: float = 1.0) -> None:
    """The section bench.py prints."""
    config = work / "web.conf"
    machine(cards, pids).write(config)
    env = env_for(lib.parent, config)
    print(f"\ngpumon serve: {cards} cards, {len(pids)} processes, --interval {interval:g}, server CPU "
          "(100 % = one core)")
    measure(python, env, list(viewers), seconds, interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--processes", type=int, default=64)
    parser.add_argument("--viewers", type=int, nargs="+", default=[1, 50])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpumon-web-bench-"))
    lib = build(work)
    pool = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.processes)]
    try:
        web_cost(work, lib, args.python, args.cards, [p.pid for p in pool], args.seconds, args.viewers, args.interval)
    finally:
        for p in pool:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
