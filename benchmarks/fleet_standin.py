#!/usr/bin/env python3
"""A stand-in for many ssh hosts, and what the fleet's data layer costs at 32, 128 and 256 of them.

`StandinSource` plays one host of N x 8 cards without ssh: every interval (1 s) it hands the fleet
the line `gpumon snapshot --json --stream` would print there (schema 1, moving values, one
process a card as with DDP training, or --processes N), through the same checks a real stream's line goes through
(`schema.snapshot_from_remote(json.loads(line))`) and into `Fleet.report`. Each host has a source
of its own, as with ssh, and the hosts' lines are spread over the second as real streams arrive.
The lines are made before the clock starts (a few per host, played in turn), so what is measured
is this side's cost, not the remote side's.

For the fleet TUI benchmark:

    sys.path.insert(0, "benchmarks"); from fleet_standin import standin_fleet
    fleet = standin_fleet(256)              # a Fleet like open_fleet's, hosts node000 … node255
    run_worker(fleet.run())                 # as with a real fleet
    fleet.sources[i].first_line_at          # time.monotonic() of host i's first line (None before)

Run as a program it measures the data layer alone (no view), each size in a fresh process:

  cpu %        CPU time of the process / wall time (100 % = one core)
  ms/refresh   CPU time per interval, for every host's line (one refresh of the whole fleet)
  reports/s    Fleet.report calls a second (each host once an interval)
  RSS, peak    resident memory now, and at most (VmHWM), MiB

    python benchmarks/fleet_standin.py                       # 32, 128 and 256 hosts, 20 s each
    python benchmarks/fleet_standin.py --hosts 256 --seconds 60 --processes 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumon.fleet import Fleet, Source  # noqa: E402
from gpumon.fleet.schema import snapshot_from_remote  # noqa: E402
from gpumon.model import SCHEMA_VERSION  # noqa: E402
from gpumon.remote.hosts import HostSpec  # noqa: E402

GIB = 1 << 30
VARIANTS = 6  # lines made per host, played in turn: values move every interval


def document(host: str, cards: int, rng: random.Random, now: float, processes: int = 1) -> dict:
    """One host's snapshot as its gpumon streams it (numbers moving, names fixed)."""
    gpus = []
    for index in range(cards):
        used = rng.randint(0, 80) * GIB
        gpus.append({
            "index": index, "uuid": f"GPU-{zlib.crc32(host.encode()):08x}-{index:04x}-4b8e-9c1d-6e0f2a7b5c31",
            "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0", "state": "ok",
            "utilization_gpu": rng.randint(0, 100), "utilization_memory": rng.randint(0, 60),
            "memory_total": 80 * GIB, "memory_used": used, "memory_free": 80 * GIB - used,
            "temperature": rng.randint(30, 85), "fan": None, "power_draw": round(rng.uniform(60, 700), 3),
            "power_limit": 700.0, "clock_sm": rng.choice((210, 1755, 1980)), "clock_mem": 2619, "pstate": "P0",
            "throttle_reasons": rng.choice(([], ["sw_power_cap"])), "ecc_errors_uncorrected": 0,
            "pcie_tx": rng.randint(0, 1 << 30), "pcie_rx": rng.randint(0, 1 << 30), "encoder_util": 0,
            "decoder_util": 0, "numa_node": index // 4,
            "cpu_affinity": "0-55,112-167" if index < 4 else "56-111,168-223",
            "owner": None,
            "processes": [{"pid": 10000 + index * 10 + p, "user": f"user{p}", "type": "compute",
                           "command": f"python train.py --config configs/run{p}.yaml --rank {index}",
                           "gpu_memory": used // 2, "sm_util": rng.randint(0, 100),
                           "cpu_percent": round(rng.uniform(0, 100), 1), "rss": 8 * GIB, "started": now - 3600}
                          for p in range(processes)],
        })
    return {"schema": SCHEMA_VERSION, "time": now, "host": host, "backend": "nvml", "driver_version": "570.124.06",
            "cuda_driver_version": "12.8", "gpus": gpus}


class StandinSource(Source):
    """One host, as SshSource reads it, minus ssh: a checked document every interval."""

    kind = "gpumon"

    def __init__(self, name: str, cards: int = 8, interval: float = 1.0, phase: float = 0.0, seed: int = 0,
                 processes: int = 1) -> None:
        self.hosts = (name,)
        self.interval = interval
        self.phase = phase  # where in the interval its lines arrive
        rng = random.Random(f"{seed}:{name}")
        now = time.time()
        self.lines = [json.dumps(document(name, cards, rng, now, processes)).encode() + b"\n" for _ in range(VARIANTS)]
        self.first_line_at: float | None = None

    async def run(self, fleet: Fleet) -> None:
        name = self.hosts[0]
        fleet.report(name, "connecting")
        loop = asyncio.get_running_loop()
        start = loop.time() + self.phase
        tick = 0
        while True:
            await asyncio.sleep(max(0.0, start + tick * self.interval - loop.time()))
            snapshot = snapshot_from_remote(json.loads(self.lines[tick % VARIANTS]))
            if self.first_line_at is None:
                self.first_line_at = time.monotonic()
            fleet.report(name, "live", snapshot=snapshot, source="gpumon", note=None)
            tick += 1


def standin_fleet(hosts: int, cards: int = 8, interval: float = 1.0, seed: int = 0, processes: int = 1) -> Fleet:
    """A Fleet of `hosts` stand-in hosts (node000 …), their lines spread over each interval."""
    specs = [HostSpec(f"node{i:03d}", f"node{i:03d}") for i in range(hosts)]
    sources = [StandinSource(spec.name, cards, interval, phase=interval * i / hosts, seed=seed, processes=processes)
               for i, spec in enumerate(specs)]
    return Fleet(specs, sources, interval)


def _memory() -> tuple[float, float]:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def measure(hosts: int, seconds: float, warmup: float = 3.0, processes: int = 1) -> dict:
    fleet = standin_fleet(hosts, processes=processes)
    reports = [0]
    fleet.subscribe(lambda status: reports.__setitem__(0, reports[0] + 1))

    async def main() -> dict:
        runner = asyncio.create_task(fleet.run())
        await asyncio.sleep(warmup)
        before, cpu0, wall0 = reports[0], time.process_time(), time.perf_counter()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        live = sum(s.state == "live" for s in fleet.statuses())
        fleet.stop()
        await runner
        rss, peak = _memory()
        return {"hosts": hosts, "live": live, "cpu_pct": 100 * cpu / wall, "ms_per_refresh": 1000 * cpu / wall,
                "reports_per_s": (reports[0] - before) / wall, "rss": rss, "peak": peak}

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="32,128,256", help="comma list of fleet sizes")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--processes", type=int, default=1, help="GPU processes a card (default 1)")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a size, measured in this process
    opts = parser.parse_args()
    if opts.one:
        print(json.dumps(measure(opts.one, opts.seconds, processes=opts.processes)))
        return
    baseline = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r); import gpumon.fleet, "
                               "gpumon.fleet.schema; print(open('/proc/self/status').read())" % str(ROOT)],
                              capture_output=True, text=True, check=True).stdout
    base_rss = next(int(line.split()[1]) for line in baseline.splitlines() if line.startswith("VmRSS")) / 1024
    print(f"interval 1 s, 8 cards a host, {opts.processes} process(es) a card; "
          f"the data layer imported alone: {base_rss:.0f} MiB RSS")
    print(f"{'hosts':>6} {'live':>5} {'cpu %':>7} {'ms/refresh':>11} {'reports/s':>10} {'RSS MiB':>8} {'peak MiB':>9}")
    for size in (int(n) for n in opts.hosts.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(size), "--seconds", str(opts.seconds),
                              "--processes", str(opts.processes)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout)
        print(f"{r['hosts']:>6} {r['live']:>5} {r['cpu_pct']:>7.1f} {r['ms_per_refresh']:>11.1f} "
              f"{r['reports_per_s']:>10.0f} {r['rss']:>8.0f} {r['peak']:>9.0f}")


if __name__ == "__main__":
    main()
