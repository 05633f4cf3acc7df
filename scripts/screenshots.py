#!/usr/bin/env python3
"""Render the SVG screenshots in screenshots/ from the demo backend, at fixed sizes and time.

Run from the repo root after any UI change: `python scripts/screenshots.py` (it also makes the
web page's PNGs: scripts/web_screenshots.py). The scenes are
defined in scripts/showcase.py; tests/test_screenshots.py fails when a file here is out of date.
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

from showcase import SHOTS, demo_app, showcase_state, wait_for_first_frame  # noqa: E402


async def render(name: str, options: dict, size: tuple[int, int], keys: tuple[str, ...], out: Path) -> Path:
    app = demo_app(**options)
    async with app.run_test(size=size) as pilot:
        await wait_for_first_frame(pilot)
        for key in keys:
            await pilot.press(key)
        await pilot.pause(0.3)
        app.save_screenshot(filename=name, path=str(out))
    return out / name


async def render_tui(out: Path) -> None:
    with showcase_state():  # jobs and command history from a fixed folder, not the user's own
        for name, options, size, keys in SHOTS:
            await render(name, options, size, keys, out)
            print(f"screenshots/{name}")


def main() -> None:
    out = ROOT / "screenshots"
    out.mkdir(exist_ok=True)
    asyncio.run(render_tui(out))
    # gpumon serve's page, in Chromium: after the event loop, as Playwright's sync API must be.
    from web_screenshots import render as render_web

    for path in render_web(out):
        print(f"screenshots/{path.name}")


if __name__ == "__main__":
    main()
