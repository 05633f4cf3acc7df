#!/usr/bin/env python3
"""PNG screenshots of `gpumon serve --demo lost` (card 2 falls off the bus) at desktop and phone
width, and of the users section of `gpumon serve --demo` (bob's notebook holds a card idle), in
Debian's Chromium.

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
# The users section alone (the default scenario: in "lost" bob's card is gone by then).
USERS_SHOTS = (("web-users.png", {"width": 1280, "height": 800}, "light"),
               ("web-users-phone.png", {"width": 390, "height": 844}, "light"))


def _serve(scenario: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "gpumon", "serve", "--demo", "--scenario", scenario, "--listen", "127.0.0.1:0",
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

    servers: list[tuple[subprocess.Popen, str]] = []
    made = []
    try:
        for scenario in ("lost", "default"):
            servers.append(_serve(scenario))
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
            pages = []
            for (_, url), shots in zip(servers, (SHOTS, USERS_SHOTS)):
                for name, viewport, scheme in shots:
                    page = browser.new_page(viewport=viewport, color_scheme=scheme, device_scale_factor=1)
                    page.goto(url)
                    pages.append((name, page, shots is USERS_SHOTS))
            time.sleep(HISTORY_S)  # the sparklines fill with what the pages have seen; bob's idle time grows
            for name, page, users in pages:
                page.wait_for_selector(".card")
                if users:
                    page.wait_for_selector('#users-table tr[data-idle="yes"]')
                    page.locator("#users").screenshot(path=str(out / name))
                else:
                    page.screenshot(path=str(out / name))
                made.append(out / name)
            browser.close()
    finally:
        for proc, _ in servers:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    return made


if __name__ == "__main__":
    folder = ROOT / "screenshots"
    for path in render(folder):
        print(f"screenshots/{path.name}")
