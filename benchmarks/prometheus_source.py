#!/usr/bin/env python3
"""What one refresh of `--prometheus-url` costs against a real Prometheus holding a big cluster.

A static HTTP server on loopback serves N hosts (default 256) x 8 cards of dcgm-exporter metrics
(its default counters and DCP fields, 23 metrics a card, with Hostname, DCGM_FI_DRIVER_VERSION and,
on every other card, a pod), one scrape target per host; a real Prometheus (Debian's `prometheus`)
scrapes them every 15 s. Then gpumon's PrometheusSource refreshes R times into a Fleet, every 5 s
as it does by default (so about one refresh in three sees new samples of a host):

  wall ms      one refresh, from asking to every host reported (its queries run at once)
  cpu ms       CPU time of this process for it (all threads: reading, parsing, snapshots, reports)
  prom cpu ms  CPU time Prometheus spent answering
  KB           bytes received (JSON, uncompressed on loopback)

and, for comparison, two other ways to ask: every GPU series with all its labels in one query
(`{__name__=~"..."}`), and one query per host. Results are printed, not asserted.

    python benchmarks/prometheus_source.py                  # 256 hosts, 15 refreshes
    python benchmarks/prometheus_source.py --hosts 64 --refreshes 5
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from promlab import Prometheus, StaticServer, prometheus_binary, wait_until  # noqa: E402

from gpumon.fleet import Fleet, PrometheusSource  # noqa: E402
from gpumon.fleet.prometheus.api import query  # noqa: E402
from gpumon.fleet.prometheus.dcgm import FIELDS, SAMPLE_AGE  # noqa: E402

CARDS = 8
# dcgm-exporter 3.3's default counters and DCP fields: (name, type, low, high).
METRICS = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", 210, 1980), ("DCGM_FI_DEV_MEM_CLOCK", "gauge", 2619, 2619),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", 30, 80), ("DCGM_FI_DEV_GPU_TEMP", "gauge", 30, 85),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", 60, 700), ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", 1e9, 9e11),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", 0, 0), ("DCGM_FI_DEV_GPU_UTIL", "gauge", 0, 100),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", 0, 100), ("DCGM_FI_DEV_ENC_UTIL", "gauge", 0, 0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", 0, 0), ("DCGM_FI_DEV_XID_ERRORS", "gauge", 0, 0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", 0, 81000), ("DCGM_FI_DEV_FB_USED", "gauge", 0, 81000),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", 559, 559), ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", 0, 1e9),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", 0, 0), ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", 0, 0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", 0, 0), ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", 0, 0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", 0, 1), ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", 0, 1),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", 0, 1),
]


def exposition(host: int, rng: random.Random) -> bytes:
    name = f"gpu-node-{host:03d}"
    cards = []
    for gpu in range(CARDS):
        labels = (f'gpu="{gpu}",UUID="GPU-{host:08x}-{gpu:04x}-4b8e-9c1d-6e0f2a7b5c31",'
                  f'pci_bus_id="00000000:{0x18 + gpu:02X}:00.0",device="nvidia{gpu}",modelName="NVIDIA H100 80GB HBM3",'
                  f'Hostname="{name}",DCGM_FI_DRIVER_VERSION="570.124.06"')
        if gpu % 2 == 0:
            labels += f',container="pytorch",namespace="team-{host % 7}",pod="train-{host:03d}-{gpu}-7f9c6d-x2x4q"'
        cards.append(labels)
    lines = []
    for metric, kind, low, high in METRICS:
        lines += [f"# HELP {metric} {metric}.", f"# TYPE {metric} {kind}"]
        lines += [f"{metric}{{{labels}}} {rng.uniform(low, high):.6g}" for labels in cards]
    return ("\n".join(lines) + "\n").encode()


def cpu_of(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def measure(label: str, prom_pid: int, action) -> dict:
    wall0, cpu0, prom0 = time.perf_counter(), time.process_time(), cpu_of(prom_pid)
    received = action()
    return {"way": label, "wall": (time.perf_counter() - wall0) * 1000, "cpu": (time.process_time() - cpu0) * 1000,
            "prom": (cpu_of(prom_pid) - prom0) * 1000, "kb": received / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=256)
    parser.add_argument("--refreshes", type=int, default=15)
    opts = parser.parse_args()
    binary = prometheus_binary()
    if binary is None:
        sys.exit("prometheus is not installed (Debian: apt-get install prometheus)")
    rng = random.Random(1)
    static = StaticServer()
    for host in range(opts.hosts):
        static.page(f"/node/{host}", exposition(host, rng))
    target = f"127.0.0.1:{static.port}"
    with tempfile.TemporaryDirectory(prefix="gpumon-bench-prom-") as tmp:
        server = Prometheus(binary, Path(tmp), [{"job_name": "dcgm", "static_configs": [
            {"targets": [target],
             "labels": {"__metrics_path__": f"/node/{h}", "instance": f"10.0.{h // 250}.{h % 250}:9400"}}
            for h in range(opts.hosts)]}], scrape_interval="15s")
        try:
            server.start()
            started = time.monotonic()
            wait_until(lambda: len(server.query("DCGM_FI_DEV_GPU_TEMP")) == opts.hosts * CARDS, 120,
                       f"{opts.hosts * CARDS} cards in Prometheus", step=1.0)
            series = int(float(server.query("count({__name__=~\"DCGM_.+\"})")[0]["value"][1]))
            print(f"Prometheus holds {opts.hosts} hosts x {CARDS} cards ({series} series), "
                  f"scraped after {time.monotonic() - started:.0f} s")
            rows = run(server, opts)
        finally:
            server.stop()
            static.close()
    print(f"\n{'way':<40} {'wall ms':>9} {'cpu ms':>8} {'prom cpu ms':>12} {'KB':>8}")
    for row in rows:
        print(f"{row['way']:<40} {row['wall']:>9.0f} {row['cpu']:>8.0f} {row['prom']:>12.0f} {row['kb']:>8.0f}")


def run(server: Prometheus, opts: argparse.Namespace) -> list[dict]:
    source = PrometheusSource(server.url, interval=5.0, timeout=30)
    fleet = Fleet([], [source], 5.0)
    prom_pid = server.proc.pid

    async def refresh() -> int:
        cluster = await source.read()
        source.publish(fleet, cluster)
        return source.last_bytes

    loop = asyncio.new_event_loop()
    samples = []
    for i in range(opts.refreshes + 1):
        sample = measure("gpumon: 4 queries a refresh", prom_pid, lambda: loop.run_until_complete(refresh()))
        if i:  # the first one also finds every host
            samples.append(sample)
        time.sleep(max(0.0, 5.0 - sample["wall"] / 1000))
    loop.close()
    live = sum(s.state == "live" for s in fleet.statuses())
    cards = sum(len(s.snapshot.gpus) for s in fleet.statuses() if s.snapshot)
    print(f"the fleet: {len(fleet.names)} hosts ({live} live), {cards} cards")
    rows = [{"way": f"gpumon: 4 queries a refresh (median of {len(samples)})",
             **{k: statistics.median(s[k] for s in samples) for k in ("wall", "cpu", "prom", "kb")}},
            {"way": "  the slowest of them", **{k: max(s[k] for s in samples) for k in ("wall", "cpu", "prom", "kb")}}]

    names = "|".join((*FIELDS, SAMPLE_AGE))
    rows.append(measure("every series, all labels (1 query)", prom_pid,
                        lambda: query(server.url, f'{{__name__=~"{names}"}}', 30)[2]))

    def per_host() -> int:
        return sum(query(server.url, f'{{__name__=~"{names}",Hostname="gpu-node-{h:03d}"}}', 30)[2]
                   for h in range(opts.hosts))

    rows.append(measure(f"one query per host ({opts.hosts} queries)", prom_pid, per_host))
    return rows


if __name__ == "__main__":
    main()
