#!/usr/bin/env python3
"""Render the SVG screenshots in screenshots/ from the demo backend, at fixed sizes and time.

Run from the repo root after any UI change: `python scripts/screenshots.py`. Each shot builds the
app with the same factory as the CLI, fills ten minutes of chart history, then presses keys.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["TZ"] = "UTC"
time.tzset()

from gpumon.backends.demo import DemoBackend  # noqa: E402
from gpumon.tui.app import GpumonApp, create_app  # noqa: E402

FROZEN = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
HISTORY = 300


def demo_app(scenario: str = "default", theme: str | None = None, cards: int | None = None,
             env: dict[str, str] | None = None) -> GpumonApp:
    """A demo app at a frozen clock with `HISTORY` samples of history already taken."""
    clock = [FROZEN - HISTORY]

    def tick() -> float:
        clock[0] += 1.0
        return clock[0]

    backend = DemoBackend(scenario, seed=0, cards=cards, clock=tick)
    backend.host = "demo-gpu-node"
    app = create_app(backend, interval=1.0, theme=theme, env=env or {}, sample_count=1)
    for _ in range(HISTORY - 1):
        app.sampler.history.add(app.sampler.collect())
    return app


async def shoot(app: GpumonApp, size: tuple[int, int], path: Path, keys: tuple[str, ...] = ()) -> None:
    async with app.run_test(size=size) as pilot:
        while app.sampler.latest is None:
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.3)
        app.save_screenshot(filename=path.name, path=str(path.parent))


SHOTS = [
    ("main-200x60.svg", dict(), (200, 60), ()),
    ("main-120x40.svg", dict(), (120, 40), ()),
    ("main-80x24.svg", dict(), (80, 24), ()),
    ("filter-120x40.svg", dict(), (120, 40), ("slash", "a", "l", "i", "c", "e")),
    ("help-120x40.svg", dict(), (120, 40), ("question_mark",)),
    ("light-120x40.svg", dict(theme="gpumon-light"), (120, 40), ("down", "down")),
    ("hot-120x40.svg", dict(scenario="hot"), (120, 40), ()),
    ("lost-120x40.svg", dict(scenario="lost"), (120, 40), ()),
    ("sixteen-cards-120x40.svg", dict(cards=16), (120, 40), ()),
]


async def main() -> None:
    out = ROOT / "screenshots"
    out.mkdir(exist_ok=True)
    for name, options, size, keys in SHOTS:
        await shoot(demo_app(**options), size, out / name, keys)
        print(f"screenshots/{name}")


if __name__ == "__main__":
    asyncio.run(main())
