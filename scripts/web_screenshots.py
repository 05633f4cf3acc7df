#!/usr/bin/env python3
"""PNG screenshots of `gpumon serve --demo lost` (card 2 falls off the bus) at desktop and phone
width, in Debian's Chromium.

Run by scripts/screenshots.py (or alone: `python scripts/web_screenshots.py`). The page shows live
demo values and the time, so these are not compared byte for byte as the terminal's SVGs are.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
INTERVAL = 0.25
HISTORY_S = 15.0  # a sparkline's minute of points (60) at this interval
SHOTS = (("web-desktop.png", {"width": 1280, "height": 800}, "light"),
         ("web-phone.png", {"width": 390, "height": 844}, "light"),
         ("web-desktop-dark.png", {"width": 1280, "height": 800}, "dark"))


def _serve() -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "gpumon", "serve", "--demo", "--scenario", "lost", "--listen", "127.0.0.1:0",
            "--interval", str(INTERVAL)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    found = re.search(r"http://\S+", line)
    if not found:
        proc.kill()
        raise SystemExit(f"gpumon serve printed no URL: {line!r}")
    return proc, found.group(0)


def render(out: Path) -> list[Path]:
    chromium = shutil.which("chromium")
    if chromium is None:
        print("(no chromium: the web page's screenshots are not made; apt-get install chromium)")
        return []
    from playwright.sync_api import sync_playwright

    proc, url = _serve()
    made = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            pages = []
            for name, viewport, scheme in SHOTS:
                page = browser.new_page(viewport=viewport, color_scheme=scheme, device_scale_factor=1)
                page.goto(url)
                pages.append((name, page))
            time.sleep(HISTORY_S)  # the sparklines fill with what the pages have seen
            for name, page in pages:
                page.wait_for_selector(".card")
                page.screenshot(path=str(out / name))
                made.append(out / name)
            browser.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    return made


if __name__ == "__main__":
    folder = ROOT / "screenshots"
    for path in render(folder):
        print(f"screenshots/{path.name}")
