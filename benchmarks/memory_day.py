#!/usr/bin/env python3
"""Memory over a long run: the real TUI (on a pseudo-terminal that answers like a local terminal)
and the real `gpumon watch`, side by side against the fake driver (8 cards with moving values, K
real idle processes), sampling every `--interval` (0.1 s: ten samples a second, so 30 minutes are
18,000 samples, five hours at the default 1 s). Their resident memory (VmRSS) is printed every
`--every` seconds, then the growth per minute once the TUI's history is full (the chart window's
10 minutes), where both should be flat. `--churn N`: N of the processes end each minute and new
ones take their cards (jobs come and go over a day), so what is kept per process must be let go.

Run from the repo root: `python benchmarks/memory_day.py [--minutes 30] [--processes 16]`. Needs
a C compiler (the fake driver). Printed, never asserted: a shared machine is noisy.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from fakenvml import build  # noqa: E402
from scenario import env_for, machine  # noqa: E402

HISTORY_S = 600  # the TUI's longest chart window: its histories are full after this long
DSR, CPR = b"\x1b[6n", b"\x1b[1;1R"


class OnPty:
    """A command on a 200x50 pseudo-terminal whose output is read at once, position reports answered."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
        os.close(slave)
        self._stop = False
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while not self._stop:
            if not select.select([self.master], [], [], 0.2)[0]:
                continue
            try:
                data = os.read(self.master, 65536)
                if DSR in data:
                    os.write(self.master, CPR)
            except OSError:
                return
            if not data:
                return

    def stop(self) -> None:
        self._stop = True
        os.write(self.master, b"q")
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares growth, MiB per minute, of (seconds, MiB) points."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_m = sum(m for _, m in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return 60 * sum((t - mean_t) * (m - mean_m) for t, m in points) / var if var else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--interval", type=float, default=0.1)
    parser.add_argument("--processes", type=int, default=16)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between two readings of RSS")
    parser.add_argument("--churn", type=int, default=0, help="processes replaced each minute")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpumon-memory-day-"))
    lib = build(work / "lib")
    sleepers = [subprocess.Popen(["sleep", "86400"]) for _ in range(args.processes)]
    config = work / "fake-nvml.conf"
    machine(8, [p.pid for p in sleepers]).write(config)
    env = env_for(lib.parent, config)
    env.update(GPUMON_NVML_LIB=str(lib), HOME=str(work / "home"), XDG_STATE_HOME=str(work / "state"),
               XDG_CONFIG_HOME=str(work / "config"), XDG_DATA_HOME=str(work / "data"),
               GPUMON_CLAIMS_DIR=str(work / "claims"), GPUMON_SYSTEM_CONFIG=str(work / "none.toml"))
    interval = f"{args.interval:g}"
    tui = OnPty([sys.executable, "-m", "gpumon", "--interval", interval], env)
    # Its own ledger: a watch that records would have the TUI stop recording (one recorder a ledger).
    watch_env = dict(env, XDG_STATE_HOME=str(work / "watch-state"))
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "watch", "--interval", interval],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=watch_env)
    readings: list[tuple[float, float, float]] = []
    started = time.monotonic()
    print(f"{'minute':>7} {'TUI MiB':>8} {'watch MiB':>9}", flush=True)
    next_reading = next_churn = 0.0
    try:
        while (now := time.monotonic() - started) < args.minutes * 60:
            if now >= next_reading:
                readings.append((now, rss_mib(tui.proc.pid), rss_mib(watch.pid)))
                print(f"{now / 60:7.1f} {readings[-1][1]:8.1f} {readings[-1][2]:9.1f}", flush=True)
                next_reading += args.every
            if args.churn and now >= next_churn:
                for _ in range(min(args.churn, len(sleepers))):
                    ended = sleepers.pop(0)
                    ended.kill()
                    ended.wait()
                    sleepers.append(subprocess.Popen(["sleep", "86400"]))
                machine(8, [p.pid for p in sleepers]).write(config)
                next_churn += 60.0
            time.sleep(max(0.0, min(next_reading, next_churn if args.churn else next_reading)
                           - (time.monotonic() - started)))
        readings.append((now, rss_mib(tui.proc.pid), rss_mib(watch.pid)))
    finally:
        tui.stop()
        watch.terminate()
        watch.wait()
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    full = [r for r in readings if r[0] >= HISTORY_S + 60]  # a minute more: the last tracks' points too
    print(f"\nsamples: {int(readings[-1][0] / args.interval)} at {interval} s "
          f"({readings[-1][0] * 1 / args.interval / 3600:.1f} h at 1 s)")
    if len(full) >= 2:
        print(f"growth once the history is full ({len(full)} readings from minute {full[0][0] / 60:.0f}): "
              f"TUI {slope_per_minute([(t, m) for t, m, _ in full]):+.3f} MiB/min, "
              f"watch {slope_per_minute([(t, m) for t, _, m in full]):+.3f} MiB/min")
    else:
        print(f"(run past minute {(HISTORY_S + 60) / 60 + 1:.0f} for the growth once the history is full)")


if __name__ == "__main__":
    main()
