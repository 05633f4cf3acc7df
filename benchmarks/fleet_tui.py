#!/usr/bin/env python3
"""The fleet TUI at scale: the real app on a pseudo-terminal, fed N stand-in hosts x 8 cards at
1 Hz (benchmarks/fleet_standin.py: each host's line goes through the same checks as an ssh
stream's; no ssh), at 32, 128 and 256 hosts. The targets: 256 hosts under 25 % of one core
and 300 MiB, keys answered in under 100 ms, every host drawn within 3 s of its first line.

  cpu %        CPU time of the app's process / wall time, in the steady state (100 % = one core)
  KB/s         bytes written to the terminal per second
  peak MiB     peak resident memory (VmHWM)
  all shown s  from start until every host's row holds its first reading (the rows on screen are
               repainted in the next frame; the others when scrolled to)
  lag max s    the longest any host waited between its first line and its row holding it
  move ms      `j`/`k` read by the app until its frame with the moved selection goes out
  help ms      `?` until the help screen is on the terminal, median / max of 8 presses
  quit ms      `q` until the process has exited (under a second whatever the hosts do)

    python benchmarks/fleet_tui.py                    # 32, 128 and 256 hosts, 20 s each
    python benchmarks/fleet_tui.py --hosts 256 --seconds 60
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench import PtyRun  # noqa: E402

SIZE = (120, 40)

# The app, run as its own process: N stand-in hosts; on quit, when each host's first line came
# and when the overview first had its row, and for each `j`/`k` the input thread read, how long
# until the output layer sent the next frame (the moved selection).
CHILD = """
import json, sys, time
sys.path.insert(0, {benchmarks!r})
from textual import events
from fleet_standin import standin_fleet
from gpumon.tui.fleet.app import FleetApp
from gpumon.tui.fleet.host_table import HostTable
from gpumon.tui.wire.driver import WireDriver

moves, pressed = [], []
process, send = WireDriver.process_message, WireDriver._send

def process_message(self, message):
    if isinstance(message, events.Key) and message.key in ("j", "k"):
        pressed.append(time.monotonic())
    process(self, message)

def _send(self):
    if pressed and self._diff.pending:
        moves.append(time.monotonic() - pressed.pop())
    send(self)

WireDriver.process_message, WireDriver._send = process_message, _send

hosts, out = int(sys.argv[1]), sys.argv[2]
fleet = standin_fleet(hosts)
started = time.monotonic()
rowed = {{}}
update = HostTable.update_host

def update_host(self, status):
    changed = update(self, status)
    if status.host not in rowed and status.snapshot is not None:  # its first reading, in its row
        rowed[status.host] = time.monotonic()
    return changed

HostTable.update_host = update_host
FleetApp(fleet).run()
first = {{s.hosts[0]: s.first_line_at for s in fleet.sources}}
lags = [rowed[h] - first[h] for h in rowed if first.get(h) is not None]
json.dump({{"rows": len(rowed), "all_shown_s": max(rowed.values()) - started if len(rowed) == hosts else None,
           "lag_max_s": max(lags) if lags else None, "moves_ms": [m * 1000 for m in moves]}}, open(out, "w"))
"""


def time_until(run: PtyRun, key: str, needle: bytes, timeout: float = 5.0) -> float | None:
    """Seconds from sending `key` until `needle` reaches the terminal."""
    run._tail = b""  # the drain thread's window of the newest output
    sent = time.monotonic()
    run.key(key)
    while time.monotonic() - sent < timeout:
        if needle in run._tail:
            return time.monotonic() - sent
        time.sleep(0.002)
    return None


def env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    environ.update(TERM="xterm-256color", PYTHONPATH=str(ROOT))
    environ.pop("COLORTERM", None)
    return environ


def measure(hosts: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "shown.json"
        child = CHILD.format(benchmarks=str(ROOT / "benchmarks"))
        run = PtyRun([sys.executable, "-c", child, str(hosts), str(out)], env(), size=SIZE)
        time.sleep(5.0)  # start-up and every host's first line
        cpu0, bytes0, t0 = run.cpu_seconds(), run.bytes, time.monotonic()
        time.sleep(seconds)
        cpu1, bytes1, t1 = run.cpu_seconds(), run.bytes, time.monotonic()
        for i in range(8):
            run.key("j" if i % 2 == 0 else "k")
            time.sleep(0.37)  # at different moments of the refresh cycle
        keys = []
        for _ in range(8):
            keys.append(time_until(run, "?", b"this help"))  # a line near the help's top
            run.key("\x1b")
            time.sleep(0.8)
        peak_mib = run.peak_rss_mib()  # (read while it runs)
        quit_at = time.monotonic()
        run.key("q")
        try:
            run.proc.wait(10)
            quit_ms = (time.monotonic() - quit_at) * 1000
        except subprocess.TimeoutExpired:
            quit_ms = None
        shown = json.loads(out.read_text()) if out.exists() else {}
        result = {"hosts": hosts, "cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0),
                  "kb_per_s": (bytes1 - bytes0) / (t1 - t0) / 1024, "peak_mib": peak_mib,
                  "keys_ms": [k * 1000 for k in keys if k is not None], "quit_ms": quit_ms, **shown}
        run.stop()
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[32, 128, 256])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    print(f"{'hosts':>6} {'cpu %':>7} {'KB/s':>6} {'peak MiB':>9} {'all shown s':>12} {'lag max s':>10} "
          f"{'move ms':>10} {'help ms':>10} {'quit ms':>8}   (median / max)")
    for hosts in args.hosts:
        r = measure(hosts, args.seconds)
        shown = "n/a" if r.get("all_shown_s") is None else f"{r['all_shown_s']:.2f}"
        lag = "n/a" if r.get("lag_max_s") is None else f"{r['lag_max_s']:.2f}"
        print(f"{hosts:>6} {r['cpu_pct']:>7.1f} {r['kb_per_s']:>6.1f} {r['peak_mib']:>9.0f} {shown:>12} {lag:>10} "
              f"{spread(r['moves_ms']):>10} {spread(r['keys_ms']):>10} "
              f"{'n/a' if r['quit_ms'] is None else format(r['quit_ms'], '.0f'):>8}", flush=True)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} / {max(values):.0f}" if values else "n/a"

if __name__ == "__main__":
    main()
