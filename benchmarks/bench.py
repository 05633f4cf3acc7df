#!/usr/bin/env python3
"""What gpumon costs on a busy machine, measured on the real programs, side by side with nvitop.

Each tool runs under a pseudo-terminal of fixed size against the test suite's fake
libnvidia-ml.so.1 (N cards, K real idle processes listed as GPU processes), for a fixed time:

  cpu %      CPU time of the whole process tree / wall time (100 % = one core)
  KB/s       bytes written to the terminal per second
  peak MiB   peak resident memory (VmHWM)
  frame s    time until the first frame (anything drawn: gpumon draws before the driver answers)
  cards s    time until the first frame that shows the card names
  key ms     keypress-to-screen latency while a sample is stuck in a slow driver call (TUIs)

The pseudo-terminal answers cursor position reports at once, as a local terminal does (gpumon
paces its frames on them). Bytes per second are measured at further sizes too (--sizes), and
with --slow-link RATE each TUI runs in tmux behind a RATE bytes/s link that queues like sshd
(benchmarks/slowlink.py): how far behind its screen falls, and how long `q` takes to show.

Then the slow-card behaviour: one card whose every driver call takes 1.5 s (a card going bad) and
a driver whose nvmlInit takes 3 s: how long `snapshot --timeout 2` takes, how often the healthy
cards update in `watch` meanwhile, and when the TUI draws its first frame and the cards.

Last, `gpumon serve`: the web page's server CPU with no page, 1 and 50 pages open
(benchmarks/web_viewers.py).

Tools: gpumon (TUI), gpumon watch, a plain nvidia-ml-py + psutil loop (the floor any Python monitor
pays), and nvitop when it is installed (`pip install nvitop`). Results are printed, not asserted.

    python benchmarks/bench.py                 # 8 cards; 64 and 512 processes; 60 s each
    python benchmarks/bench.py --seconds 20 --processes 64
    python benchmarks/bench.py --rounds 5 --steady-only   # tools alternated, medians and ratios

With --rounds N each tool runs N times, the tools taking turns (each round in a rotated order), so
that the machine's drift hits them alike; the table gives each figure's median, and the TUI/floor
and watch/floor ratios are taken within each round (the floor run beside the tool) and their
median printed with their range.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenvml import build  # noqa: E402
from link_lag import lag_on_link  # noqa: E402
from scenario import env_for, machine  # noqa: E402

NEEDLE = "H100 80GB"  # what every tool prints of the name (compact views drop "NVIDIA ")
SIZE = (200, 50)  # the size of the main measurements; --sizes adds bytes at others
DSR, CPR = b"\x1b[6n", b"\x1b[1;1R"  # a position report asked for, and a terminal's answer


@dataclass
class Result:
    tool: str
    cpu_percent: float = 0.0
    bytes_per_s: float = 0.0
    peak_mib: float = 0.0
    first_frame_s: float | None = None
    first_any_s: float | None = None
    key_ms: list[float] = field(default_factory=list)


class PtyRun:
    """A command on a pseudo-terminal; a thread drains and counts what it writes."""

    def __init__(self, argv: list[str], env: dict[str, str], size: tuple[int, int] = SIZE,
                 on_output: Callable[[bytes], None] | None = None) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     start_new_session=True, close_fds=True)
        os.close(slave)
        self.bytes = 0
        self.first_frame: float | None = None  # card names on screen
        self.first_any: float | None = None  # anything on screen
        self.last_output = time.monotonic()
        self._tail = b""
        self.on_output = on_output  # called with every chunk read, in order (from the drain thread)
        self._stop = False
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        needle = NEEDLE.encode()
        while not self._stop:
            ready, _, _ = select.select([self.master], [], [], 0.1)
            if not ready:
                continue
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.bytes += len(data)
            self.last_output = time.monotonic()
            if self.on_output is not None:
                self.on_output(data)
            if DSR in (self._tail[-3:] + data):  # everything before it is "drawn": answer at once
                try:
                    os.write(self.master, CPR)
                except OSError:
                    return
            if self.first_any is None and any(marker in data for marker in (b"gpumon", b"NVITOP", needle)):
                self.first_any = self.last_output - self.started  # the tool's header: a frame is up
            self._tail = (self._tail + data)[-4096:]
            if self.first_frame is None:
                if needle in self._tail:
                    self.first_frame = self.last_output - self.started

    def key(self, text: str) -> None:
        os.write(self.master, text.encode())

    def cpu_seconds(self) -> float:
        import psutil

        total = 0.0
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root] + root.children(recursive=True):
                t = p.cpu_times()
                total += t.user + t.system
        except psutil.Error:
            pass
        return total

    def peak_rss_mib(self) -> float:
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0.0

    def stop(self) -> None:
        self._stop = True
        try:
            if self.proc.poll() is not None:  # (it has left by itself: `q`)
                raise ProcessLookupError
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(5)
        except ProcessLookupError:
            pass
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.master)


def tools(python: str) -> dict[str, list[str]]:
    found = {
        "gpumon": [python, "-m", "gpumon", "--interval", "1"],
        "gpumon watch": [python, "-m", "gpumon", "watch", "--interval", "1", "--alert", "temp > 200"],
        "plain loop": [python, str(ROOT / "benchmarks" / "plain_loop.py")],
    }
    nvitop = shutil.which("nvitop") or (shutil.which("nvitop", path=str(Path(python).parent)))
    if nvitop:
        found["nvitop"] = [nvitop, "--interval", "1", "--force-color"]
    return found


def measure(name: str, argv: list[str], env: dict[str, str], seconds: float, size: tuple[int, int] = SIZE) -> Result:
    run = PtyRun(argv, env, size)
    time.sleep(3.0)  # start-up is measured separately (first frame), not in the steady state
    cpu0, bytes0, t0 = run.cpu_seconds(), run.bytes, time.monotonic()
    time.sleep(seconds)
    cpu1, bytes1, t1 = run.cpu_seconds(), run.bytes, time.monotonic()
    result = Result(name, 100 * (cpu1 - cpu0) / (t1 - t0), (bytes1 - bytes0) / (t1 - t0) / 1024,
                    run.peak_rss_mib(), run.first_frame, run.first_any)
    run.stop()
    return result


def key_latency(argv: list[str], env: dict[str, str], presses: int = 5) -> list[float]:
    """Send a key while the driver call of a sample hangs, and time the screen's answer."""
    run = PtyRun(argv, env)
    deadline = time.monotonic() + 20
    while run.first_frame is None and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0)
    latencies = []
    for i in range(presses):
        # Wait for a quiet moment: a sample is blocked in the slow call, nothing else redraws.
        while time.monotonic() - run.last_output < 0.3:
            time.sleep(0.02)
        before = run.bytes
        sent = time.monotonic()
        run.key("j" if i % 2 == 0 else "k")
        while run.bytes == before and time.monotonic() - sent < 2.0:
            time.sleep(0.001)
        latencies.append((run.last_output - sent) * 1000 if run.bytes != before else float("inf"))
    run.stop()
    return latencies


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def rounds_of(chosen: dict[str, list[str]], env: dict[str, str], seconds: float,
              rounds: int) -> list[dict[str, Result]]:
    """Each tool `rounds` times, taking turns: round i starts i tools further along."""
    names = list(chosen)
    done: list[dict[str, Result]] = []
    for i in range(rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        done.append({name: measure(name, chosen[name], env, seconds) for name in order})
    return done


def medians(done: list[dict[str, Result]]) -> list[Result]:
    """One Result per tool, each figure the median over the rounds."""
    out = []
    for name in done[0]:
        runs = [r[name] for r in done]
        firsts = [r.first_frame_s for r in runs if r.first_frame_s is not None]
        anys = [r.first_any_s for r in runs if r.first_any_s is not None]
        out.append(Result(name, median([r.cpu_percent for r in runs]), median([r.bytes_per_s for r in runs]),
                          median([r.peak_mib for r in runs]), median(firsts) if firsts else None,
                          median(anys) if anys else None))
    return out


def print_ratios(done: list[dict[str, Result]]) -> None:
    """CPU of each tool over the floor's in the same round, and the cards' first frame against nvitop's."""
    floor = "plain loop"
    for name in ("gpumon", "gpumon watch", "nvitop"):
        pairs = [(r[name].cpu_percent, r[floor].cpu_percent) for r in done if name in r and floor in r]
        if pairs:
            ratios = [a / b if b else float("inf") for a, b in pairs]
            print(f"  {name} / floor, cpu: median {median(ratios):.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x, "
                  f"{len(ratios)} rounds; cpu-s/min {median([a * 0.6 for a, _ in pairs]):.2f} vs "
                  f"{median([b * 0.6 for _, b in pairs]):.2f})")
    cards = [(r["gpumon"].first_frame_s, r["nvitop"].first_frame_s) for r in done
             if "gpumon" in r and "nvitop" in r and r["gpumon"].first_frame_s and r["nvitop"].first_frame_s]
    if cards:
        print(f"  cards s, gpumon / nvitop: median {median([g for g, _ in cards]):.2f} / "
              f"{median([n for _, n in cards]):.2f} s (gpumon first in {sum(g <= n for g, n in cards)}/{len(cards)})")


def print_table(cards: int, processes: int, results: list[Result]) -> None:
    print(f"\n{cards} cards, {processes} processes, {SIZE[0]}x{SIZE[1]} terminal")
    print(f"{'tool':<14}{'cpu %':>8}{'KB/s':>9}{'peak MiB':>10}{'frame s':>9}{'cards s':>9}"
          f"{'key ms (median/max)':>22}")
    for r in results:
        first = f"{r.first_frame_s:.2f}" if r.first_frame_s is not None else "-"
        frame = f"{r.first_any_s:.2f}" if r.first_any_s is not None else "-"
        keys = f"{sorted(r.key_ms)[len(r.key_ms) // 2]:.0f}/{max(r.key_ms):.0f}" if r.key_ms else "-"
        print(f"{r.tool:<14}{r.cpu_percent:>8.1f}{r.bytes_per_s:>9.1f}{r.peak_mib:>10.0f}{frame:>9}{first:>9}{keys:>22}")
    by = {r.tool: r for r in results}
    if "nvitop" in by and "gpumon" in by:
        n, g = by["nvitop"], by["gpumon"]
        ratio = lambda a, b: a / b if b else float("inf")  # noqa: E731
        print(f"gpumon / nvitop: cpu {ratio(g.cpu_percent, n.cpu_percent):.2f}x, "
              f"bytes {ratio(g.bytes_per_s, n.bytes_per_s):.2f}x, peak RSS {ratio(g.peak_mib, n.peak_mib):.2f}x")
    if "plain loop" in by and "gpumon watch" in by:
        print(f"gpumon watch / plain loop: cpu "
              f"{by['gpumon watch'].cpu_percent / max(by['plain loop'].cpu_percent, 1e-9):.2f}x")


def first_frames(argv: list[str], env: dict[str, str], runs: int = 3) -> tuple[float | None, float | None]:
    """The best of a few starts: (first frame, card names), in seconds."""
    frames, cards = [], []
    for _ in range(runs):
        run = PtyRun(argv, env)
        deadline = time.monotonic() + 30
        while run.first_frame is None and time.monotonic() < deadline:
            time.sleep(0.05)
        frames.append(run.first_any)
        cards.append(run.first_frame)
        run.stop()
    best = lambda xs: min((x for x in xs if x is not None), default=None)  # noqa: E731
    return best(frames), best(cards)


def slow_card(work: Path, lib: Path, python: str, cards: int) -> None:
    """One card whose every call takes 1.5 s; then a driver whose nvmlInit takes 3 s."""
    print(f"\nSlow card: {cards} cards, card 1's every driver call takes 1.5 s")
    config = work / "slow-card.conf"
    m = machine(cards, [])
    m.cards[1].extra["slow"] = 1500
    m.write(config)
    env = env_for(lib.parent, config)
    started = time.monotonic()
    out = subprocess.run([python, "-m", "gpumon", "snapshot", "--json", "--timeout", "2"], env=env,
                         capture_output=True, text=True, timeout=60)
    took = time.monotonic() - started
    import json

    states = [g["state"] for g in json.loads(out.stdout)["gpus"]] if out.returncode == 0 else out.stderr.strip()
    print(f"  snapshot --timeout 2: {took:.2f} s, states {states}")
    watch = subprocess.run([python, "-m", "gpumon", "watch", "--metrics", "--interval", "1", "--count", "10"],
                           env=env, capture_output=True, text=True, timeout=120)
    samples = [json.loads(line) for line in watch.stdout.splitlines() if '"sample"' in line]
    healthy = sum(all(g["state"] == "ok" for g in s["gpus"] if g["gpu"] != 1) for s in samples)
    slow = [s["gpus"][1]["state"] for s in samples]
    print(f"  watch, 10 samples at 1 s: the healthy cards fresh in {healthy}/{len(samples)}; "
          f"card 1: {', '.join(slow)}")
    frame, names = first_frames(tools(python)["gpumon"], env)
    print(f"  TUI: first frame {frame:.2f} s, card names {names:.2f} s (card 1 shows 'not responding')"
          if frame and names else "  TUI: no frame")
    slow_init = work / "slow-init.conf"
    m = machine(cards, [])
    m.delays = {"nvmlInitWithFlags": 3000}
    m.write(slow_init)
    frame, names = first_frames(tools(python)["gpumon"], env_for(lib.parent, slow_init))
    print(f"  TUI with a 3 s nvmlInit: first frame {frame:.2f} s ('opening the NVIDIA driver…'), "
          f"card names {names:.2f} s" if frame and names else "  TUI: no frame")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="steady-state time per tool (default 60)")
    parser.add_argument("--cards", type=int, default=8)
    parser.add_argument("--processes", type=int, nargs="+", default=[64, 512])
    parser.add_argument("--tools", nargs="+", help="only these tools (names as printed)")
    parser.add_argument("--python", default=sys.executable, help="the Python that has gpumon installed")
    parser.add_argument("--slow-card-only", action="store_true", help="only the slow-card behaviour")
    parser.add_argument("--sizes", nargs="*", default=["120x40"], help="more terminal sizes for bytes/s (WxH)")
    parser.add_argument("--slow-link", type=float, default=2048, metavar="RATE",
                        help="bytes/s of the slow link (0: skip; needs tmux)")
    parser.add_argument("--slow-link-seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1, help="runs of each tool, taking turns (medians)")
    parser.add_argument("--steady-only", action="store_true",
                        help="only the steady state and first frames (no key latency, sizes, link, slow card, web)")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="gpumon-bench-"))
    lib = build(work)
    if args.slow_card_only:
        slow_card(work, lib, args.python, args.cards)
        return
    pool = [subprocess.Popen(["sleep", "3600"]) for _ in range(max(args.processes))]
    available = tools(args.python)
    chosen = {k: v for k, v in available.items() if not args.tools or k in args.tools}
    if "nvitop" not in available:
        print("(nvitop is not installed: `pip install nvitop` to compare with it)")
    try:
        for processes in args.processes:
            config = work / f"fake-{processes}.conf"
            machine(args.cards, [p.pid for p in pool[:processes]]).write(config)
            env = env_for(lib.parent, config)
            done = rounds_of(chosen, env, args.seconds, max(1, args.rounds))
            results = medians(done)
            if args.steady_only:
                print_table(args.cards, processes, results)
                print_ratios(done)
                continue
            slow = work / f"slow-{processes}.conf"
            machine(args.cards, [p.pid for p in pool[:processes]], slow_ms=1500).write(slow)
            for r in results:
                if r.tool in ("gpumon", "nvitop"):
                    r.key_ms = key_latency(chosen[r.tool], env_for(lib.parent, slow))
            print_table(args.cards, processes, results)
            print_ratios(done)
            tuis = {k: v for k, v in chosen.items() if k in ("gpumon", "nvitop")}
            for size in [tuple(int(n) for n in s.split("x")) for s in args.sizes]:
                rates = {name: measure(name, argv, env, min(args.seconds, 30), size).bytes_per_s
                         for name, argv in tuis.items()}
                print(f"  bytes at {size[0]}x{size[1]}: " + ", ".join(f"{k} {v:.2f} KB/s" for k, v in rates.items()))
            if args.slow_link and processes == args.processes[0]:
                link_machine = machine(args.cards, [p.pid for p in pool[:processes]])
                link = work / "link.conf"
                for name, argv in tuis.items():
                    lags, took = lag_on_link(argv, env_for(lib.parent, link), link_machine, link, args.slow_link,
                                             (120, 40), args.slow_link_seconds, args.python)
                    settled = lags[len(lags) // 3:] or lags
                    quit_text = f"q took {took:.1f} s" if took is not None else "q: no exit within 300 s"
                    print(f"  {name} behind a {args.slow_link:g} B/s link at 120x40: lag median "
                          f"{sorted(settled)[len(settled) // 2]:.1f} s, max {max(lags):.1f} s (first {lags[0]:.1f} s); "
                          + quit_text)
        if args.steady_only:
            return
        slow_card(work, lib, args.python, args.cards)
        if not args.tools or "gpumon serve" in args.tools:
            from web_viewers import web_cost  # the web page's server with 1 and 50 pages open

            web_cost(work, lib, args.python, args.cards, [p.pid for p in pool[:args.processes[0]]],
                     min(args.seconds, 30))
    finally:
        for p in pool:
            p.kill()


if __name__ == "__main__":
    main()
