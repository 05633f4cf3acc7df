#!/usr/bin/env python3
"""Where gpumon's bytes to the terminal go, per screen region, in the steady state.

Runs the real `python -m gpumon --interval 1` under a pseudo-terminal (bench.PtyRun, which
answers the cursor position reports gpumon paces its frames on) against the fake driver with
8 cards and K real idle `sleep` processes (bench.machine), and keeps every byte it writes. The
bytes written after the first few seconds of start-up are walked with a small tokenizer that
tracks the cursor: each character of text is charged to the cell it lands on, and the cursor
moves and attribute changes (SGR) before a text run to the cell where that run starts. Cells are
mapped to regions read off the same layout, run in-process with Textual's Pilot at the same
size against the same fake machine (`widget.region` of #status, each chart, #cards, #processes,
the footer). Position report requests (ESC[6n) and synchronized-output markers belong to no
region and are counted apart, as is anything else (modes, titles).

As a check that the two layouts agree, the box-drawing characters on the region edges of the
screen rebuilt from the byte stream are compared with the Pilot screen's (values differ; the
widget borders should not).

    python benchmarks/wire_breakdown.py                          # 200x50, 30 s, 64 processes
    python benchmarks/wire_breakdown.py --size 120x40 --seconds 60
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402  (puts tests/ on the path for the fake driver)
from rich.cells import get_character_cell_size  # noqa: E402

WARMUP_S = 4.0
KINDS = ("move", "sgr", "text")
TOKEN = re.compile(
    rb"(?P<text>[^\x00-\x1f\x7f]+)"
    rb"|\x1b\[(?P<csi>[0-?]*[ -/]*[@-~])"
    rb"|(?P<string>\x1b[\]P_^].*?(?:\x07|\x1b\\))"
    rb"|(?P<esc>\x1b[ -/]*[0-~])"
    rb"|(?P<ctl>[\x00-\x1f\x7f])",
    re.S,
)


async def _layout(lib: Path, size: tuple[int, int]) -> tuple[list[tuple[str, object]], list[str]]:
    """(region name, textual Region) in the order they are painted on the map, and the screen's text."""
    from textual.widgets import Footer

    from gpumon.cards.backends.nvml import NvmlBackend
    from gpumon.tui.app import create_app
    from gpumon.tui.screens.main import CHART_METRICS

    backend = NvmlBackend(lib_path=str(lib))
    try:
        app = create_app(backend, interval=1.0)
        async with app.run_test(size=size) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.pause(2.0)  # a few samples: the layout settles (card panel heights, charts)
            screen = app.main_screen
            widgets = [("charts (frame)", screen.query_one("#charts")), ("cards", screen.query_one("#cards"))]
            widgets += [(f"chart {m}", screen.query_one(f"#chart-{m}")) for m in CHART_METRICS]
            widgets += [("status line", screen.query_one("#status")), ("filter", screen.query_one("#filter")),
                        ("processes", screen.query_one("#processes")), ("footer", screen.query_one(Footer))]
            regions = [(name, w.region) for name, w in widgets if w.display and w.region.area]
            text = [strip.text for strip in screen._compositor.render_strips()]  # for the border check only
    finally:
        backend.close()
    return regions, text


class Walker:
    """Reads the terminal byte stream, tracks the cursor, charges bytes to regions."""

    def __init__(self, size: tuple[int, int], regions: list[tuple[str, object]]) -> None:
        self.width, self.height = size
        self.map = [["other"] * self.width for _ in range(self.height)]
        for name, r in regions:  # later entries overwrite earlier ones (children over containers)
            for y in range(max(0, r.y), min(self.height, r.y + r.height)):
                for x in range(max(0, r.x), min(self.width, r.x + r.width)):
                    self.map[y][x] = name
        self.screen = [[" "] * self.width for _ in range(self.height)]
        self.y = self.x = 0
        self.pending: dict[str, int] = defaultdict(int)  # escape bytes waiting for the text they precede
        self.bytes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # region -> kind -> n

    def region(self, y: int, x: int) -> str:
        if 0 <= y < self.height and 0 <= x < self.width:
            return self.map[y][x]
        return "(off screen)"

    def walk(self, data: bytes, count_from: int) -> None:
        """Track the cursor through all of `data`; count only tokens that start at count_from or later."""
        for m in TOKEN.finditer(data):
            counted = m.start() >= count_from
            n = m.end() - m.start()
            kind = m.lastgroup
            if kind == "text":
                self._text(m.group("text").decode("utf-8", "surrogateescape"), counted)
            elif kind == "csi":
                self._csi(m.group("csi").decode("ascii", "replace"), n, counted)
            elif kind == "ctl" and m.group(0) in b"\r\n\b":
                c = m.group(0)
                # Raw mode: LF only goes down (no output post-processing turns it into CR LF).
                self.y, self.x = (self.y + 1, self.x) if c == b"\n" else (self.y, 0) if c == b"\r" \
                    else (self.y, max(0, self.x - 1))
                if counted:
                    self.pending["move"] += n
            elif counted:
                self.bytes["(other sequences)"]["other"] += n
        if self.pending:  # moves that no text followed: charged where the cursor was left
            for k, v in self.pending.items():
                self.bytes[self.region(self.y, self.x)][k] += v
            self.pending.clear()

    def _text(self, text: str, counted: bool) -> None:
        first = True
        for char in text:
            size = get_character_cell_size(char)
            y, x = self.y, (self.x if size else self.x - 1)  # zero width joins the cell before
            if counted:
                where = self.bytes[self.region(y, x)]
                where["text"] += len(char.encode("utf-8", "surrogateescape"))
                if first:
                    for k, v in self.pending.items():
                        where[k] += v
                    self.pending.clear()
            first = False
            if size and 0 <= y < self.height and 0 <= x < self.width:
                self.screen[y][x] = char
            self.x = min(self.x + size, self.width - 1)  # at the right edge the cursor stays (pending wrap)

    def _csi(self, body: str, n: int, counted: bool) -> None:
        final, params = body[-1], body[:-1]
        if final == "m":
            kind = "sgr"
        elif final in "HfABCDGd":
            kind = "move"
            nums = [int(p) if p.isdigit() else 0 for p in params.split(";")] if params else []
            step = (nums[0] or 1) if nums else 1
            if final in "Hf":
                self.y, self.x = (nums[0] or 1) - 1 if nums else 0, ((nums[1] or 1) - 1 if len(nums) > 1 else 0)
            elif final in "AB":
                self.y += step if final == "B" else -step
            elif final in "CD":
                self.x = max(0, self.x + (step if final == "C" else -step))
            elif final == "G":
                self.x = step - 1
            else:
                self.y = step - 1
        elif body == "6n":
            kind = "(pacing: ESC[6n)"
        elif body in ("?2026h", "?2026l"):
            kind = "(synchronized output)"
        else:
            kind = "(other sequences)"
        if not counted:
            return
        if kind in KINDS:
            self.pending[kind] += n
        else:
            self.bytes[kind]["other"] += n


def borders_agree(rebuilt: list[list[str]], pilot: list[str], regions: list[tuple[str, object]]) -> tuple[int, int]:
    """On the edges of the widget regions (their borders, if any): cells where either screen has a
    box-drawing character, and how many agree. Inside, values and chart frames differ by design."""
    box = lambda c: "\u2500" <= c <= "\u257f"  # noqa: E731
    edges = set()
    for name, r in regions:
        if name.startswith("chart "):  # plotext draws a chart's frame to fit its data: not layout
            continue
        for x in range(r.x, r.x + r.width):
            edges |= {(r.y, x), (r.y + r.height - 1, x)}
        for y in range(r.y, r.y + r.height):
            edges |= {(y, r.x), (y, r.x + r.width - 1)}
    total = same = 0
    for y, x in edges:
        if 0 <= y < min(len(rebuilt), len(pilot)) and 0 <= x < min(len(rebuilt[y]), len(pilot[y])):
            a, b = rebuilt[y][x], pilot[y][x]
            if box(a) or box(b):
                total += 1
                same += a == b
    return total, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="200x50", help="terminal size WxH (default 200x50)")
    parser.add_argument("--seconds", type=float, default=30.0, help="steady-state time measured (default 30)")
    parser.add_argument("--processes", type=int, default=64, help="idle processes listed on the cards")
    parser.add_argument("--cards", type=int, default=8)
    args = parser.parse_args()
    size = tuple(int(n) for n in args.size.lower().split("x"))

    pool = [subprocess.Popen(["sleep", "3600"]) for _ in range(args.processes)]
    try:
        with tempfile.TemporaryDirectory(prefix="gpumon-wire-") as tmp:
            work = Path(tmp)
            lib = bench.build(work)
            config = work / "fake.conf"
            bench.machine(args.cards, [p.pid for p in pool]).write(config)
            os.environ["FAKE_NVML_CONFIG"] = str(config)
            regions, pilot_text = asyncio.run(_layout(lib, size))

            chunks: list[bytes] = []
            run = bench.PtyRun([sys.executable, "-m", "gpumon", "--interval", "1"],
                               bench.env_for(lib.parent, config), size, on_output=chunks.append)
            try:
                time.sleep(WARMUP_S)
                start, t0 = sum(map(len, list(chunks))), time.monotonic()
                time.sleep(args.seconds)
                data, t1 = b"".join(list(chunks)), time.monotonic()
            finally:
                run.stop()
    finally:
        for p in pool:
            p.kill()
            p.wait()

    walker = Walker(size, regions)
    walker.walk(data, start)
    elapsed = t1 - t0
    total = sum(sum(kinds.values()) for kinds in walker.bytes.values())  # len(data) - start, bar a split token
    print(f"gpumon --interval 1, {args.cards} cards, {args.processes} processes, {size[0]}x{size[1]}: "
          f"{total / elapsed / 1024:.2f} KB/s over {elapsed:.0f} s (after {WARMUP_S:g} s of start-up)")
    print(f"{'region':<24}{'cells':>7}{'KB/s':>8}{'share':>8}{'moves':>8}{'SGR':>8}{'text':>8}  (bytes/s)")
    cells = defaultdict(int)
    for row in walker.map:
        for name in row:
            cells[name] += 1
    names = set(cells) | set(walker.bytes)  # regions that sent nothing are listed too
    for name in sorted(names, key=lambda name: (-sum(walker.bytes[name].values()), name)):
        kinds = walker.bytes[name]
        n = sum(kinds.values())
        parts = "".join(f"{kinds.get(k, 0) / elapsed:>8.0f}" for k in KINDS) if name[0] != "(" else ""
        print(f"{name:<24}{cells.get(name, 0) or '':>7}{n / elapsed / 1024:>8.2f}{100 * n / max(total, 1):>7.1f}%"
              + parts)
    by_kind = defaultdict(int)
    for name, kinds in walker.bytes.items():
        for k, v in kinds.items():
            by_kind[k if k != "other" else name] += v
    print("by kind: " + ", ".join(f"{k} {v / elapsed / 1024:.2f} KB/s ({100 * v / max(total, 1):.1f} %)"
                                  for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    boxes, same = borders_agree(walker.screen, pilot_text, regions)
    print(f"layout check: {same}/{boxes} box-drawing cells on the region edges match the Pilot layout")


if __name__ == "__main__":
    main()
