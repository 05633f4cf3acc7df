#!/usr/bin/env python3
"""CPU time the TUI spends on one sample, measured inside one process, and what two of its drawing
mechanisms save.

The whole-program benchmark (bench.py) measures CPU over 30 s next to nvitop: on a shared VM its
figures move by ±15 % from run to run, more than most single changes save. Here the real dashboard
(200×50, headless) is fed snapshots read from the fake driver (8 cards, 64 real idle processes, SM %
and utilisation changing every sample) and each sample's work is timed back to back: the main
screen applying the snapshot, the compositor's partial update, the update drawn into the output
layer's wanted screen and the difference rendered as bytes. With `--compare`, gpumon's lean
compositor (`gpumon/tui/wire/compositor.py`) and whole lines (`gpumon/tui/widgets/unboxed_lines.py`)
are switched off and on in turn in the same process, so the machine's drift affects all four alike.

Run from the repo root: `python benchmarks/ui_cycle.py [--compare]`. Needs a C compiler (it builds
the test suite's fake driver). Printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from fakenvml import build  # noqa: E402
from scenario import machine  # noqa: E402

SIZE = (200, 50)
ROUNDS, PER_ROUND = 6, 10


def read_snapshots(lib: Path, count: int) -> list:
    from gpumon.cards.backends.nvml import NvmlBackend
    from gpumon.cards.sampler import Sampler

    backend = NvmlBackend(lib_path=str(lib))
    sampler = Sampler(backend)
    snapshots = []
    for _ in range(count):
        snapshots.append(sampler.collect())
        time.sleep(0.02)
    backend.close()
    return snapshots


async def measure(lib: Path, snapshots: list, compare: bool) -> None:
    from rich.color import ColorSystem
    from textual._compositor import Compositor
    from textual._styles_cache import StylesCache

    from gpumon.cards.backends.nvml import NvmlBackend
    from gpumon.tui.app import create_app
    from gpumon.tui.widgets.unboxed_lines import UnboxedLinesCache
    from gpumon.tui.wire import updates
    from gpumon.tui.wire.compositor import LeanCompositor
    from gpumon.tui.wire.screen import ScreenDiff

    app = create_app(NvmlBackend(lib_path=str(lib)), interval=3600)  # no sampling of its own
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause(1.0)
        screen = app.main_screen
        compositor = screen._compositor
        wanted = ScreenDiff(*SIZE)
        updates.draw(wanted, compositor.render_update(full=True), ColorSystem.EIGHT_BIT)
        wanted.render()
        start, taken = snapshots[0].time, [0]

        def one_sample() -> None:
            taken[0] += 1
            snapshot = snapshots[taken[0] % len(snapshots)]
            screen.show_snapshot(dataclasses.replace(snapshot, time=start + taken[0]))  # ages tick too
            compositor.update_widgets(set(compositor.visible_widgets))
            update = compositor.render_update(screen_stack=app._background_screens)
            if update is not None:
                updates.draw(wanted, update, ColorSystem.EIGHT_BIT)
            wanted.render()

        whole = [w for w in screen.walk_children() if isinstance(w._styles_cache, UnboxedLinesCache)]

        def configure(lean: bool, whole_lines: bool) -> None:
            compositor.__class__ = LeanCompositor if lean else Compositor
            for widget in whole:
                widget._styles_cache = UnboxedLinesCache() if whole_lines else StylesCache()
            for _ in range(5):
                one_sample()

        configs = [(True, True)] if not compare else [(False, False), (True, False), (False, True), (True, True)]
        results: dict[tuple[bool, bool], list[float]] = {}
        for _ in range(ROUNDS):
            for config in configs:
                configure(*config)
                best = min(timeit.repeat(one_sample, number=PER_ROUND, repeat=3, timer=time.thread_time)) / PER_ROUND
                results.setdefault(config, []).append(best)
        print(f"8 cards, {screen.table.row_count} processes, {SIZE[0]}x{SIZE[1]}: ms of CPU per sample "
              f"(median of {ROUNDS} rounds, each the best of 3 × {PER_ROUND} samples)")
        for (lean, whole_lines), times in results.items():
            label = f"lean compositor {'on ' if lean else 'off'}, whole lines {'on ' if whole_lines else 'off'}"
            print(f"  {label}  {1000 * sorted(times)[len(times) // 2]:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", action="store_true",
                        help="also with the lean compositor and whole lines off, interleaved")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpumon-ui-cycle-"))
    lib = build(work)
    pool = [subprocess.Popen(["sleep", "600"]) for _ in range(64)]
    try:
        config = work / "machine.conf"
        machine(8, [p.pid for p in pool]).write(config)
        os.environ["FAKE_NVML_CONFIG"] = str(config)
        snapshots = read_snapshots(lib, 12)
        asyncio.run(measure(lib, snapshots, args.compare))
    finally:
        for process in pool:
            process.kill()
            process.wait()


if __name__ == "__main__":
    main()
