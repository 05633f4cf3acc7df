"""gpumon over a slow link: the real program in a real terminal (tmux) behind a rate-limited proxy
that queues like sshd does (benchmarks/slowlink.py), and the bytes it writes on a fast one."""

from __future__ import annotations

import os
import select
import shlex
import sys
import time
from pathlib import Path

from conftest import GIB, Card
from terminal import gpumon_on_pty

ROOT = Path(__file__).resolve().parent.parent
SLOWLINK = ROOT / "benchmarks" / "slowlink.py"


def busy_machine(fake_driver, idle_processes, cards: int = 8, processes: int = 64) -> None:
    """The benchmark's machine: 8 cards whose values move every second, 64 real processes."""
    pids = [idle_processes("sleep", "600").pid for _ in range(processes)]
    m = fake_driver.machine
    m.cards = [Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB,
                    extra=dict(util="10..95", temp="35..80", power_mw="100000..650000", power_limit_mw=700000))
               for _ in range(cards)]
    m.procs = [dict(gpu=i % cards, pid=pid, mem=GIB, sm="0..60") for i, pid in enumerate(pids)]
    fake_driver.write()


def card0_shows(screen: str, temp: int) -> bool:
    return any(" 0 H100" in line and f" {temp}°C" in line for line in screen.splitlines())


def test_on_a_2kb_link_the_screen_keeps_up_and_q_quits(fake_driver, idle_processes, tmux_session):
    busy_machine(fake_driver, idle_processes)
    m = fake_driver.machine
    m.cards[0].extra["temp"] = 10
    fake_driver.write()
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items()
                   if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "TZ"))
    python = shlex.quote(sys.executable)
    tmux = tmux_session(120, 40)
    tmux.start(f"env {env} TERM=xterm-256color {python} {SLOWLINK} 2048 -- {python} -m gpumon --interval 1")
    tmux.wait_for(lambda s: card0_shows(s, 10), timeout=60, what="the first frame through the slow link")
    # Without pacing the backlog grows by ~0.6 s every second (46 s behind after 40 s here);
    # with it the screen is about one frame behind. Generous bounds: the machine is shared.
    lags = []
    for temp in range(11, 19):
        m.cards[0].extra["temp"] = temp
        fake_driver.write()
        changed = time.monotonic()
        tmux.wait_for(lambda s, t=temp: card0_shows(s, t), timeout=60, what=f"card 0 at {temp}°C")
        lags.append(time.monotonic() - changed)
        time.sleep(max(0.0, 3 - lags[-1]))
    assert max(lags) < 10, f"the screen fell behind: {lags}"
    tmux.keys("q")
    quit_sent = time.monotonic()
    while tmux("list-sessions").strip() and time.monotonic() - quit_sent < 30:
        time.sleep(0.1)
    assert time.monotonic() - quit_sent < 10, "q took too long through the slow link"


def _bytes_per_second(fake_driver, size: tuple[int, int], seconds: float) -> float:
    env = dict(fake_driver.env, TERM="xterm-256color")
    env.pop("COLORTERM", None)
    counted, start = 0, time.monotonic()
    with gpumon_on_pty(env, size, "--interval", "1") as (_, master):
        while time.monotonic() - start < 6 + seconds:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                data = os.read(master, 65536)
                if b"\x1b[6n" in data:  # answer position reports, as a terminal does
                    os.write(master, b"\x1b[1;1R")
                if time.monotonic() - start >= 6:  # past start-up
                    counted += len(data)
    return counted / seconds


def test_bytes_to_the_terminal_stay_low(fake_driver, idle_processes):
    """Only the cells that change are sent: ~1.2 KB/s at 120x40 with 8 busy cards and 64
    processes (Textual alone: ~5 KB/s). The bound leaves room for a loaded machine."""
    busy_machine(fake_driver, idle_processes)
    rate = _bytes_per_second(fake_driver, (120, 40), 12)
    assert 100 < rate < 2500, f"{rate:.0f} bytes/s"


def test_low_bandwidth_redraws_every_few_seconds_and_b_toggles_it(monkeypatch):
    import asyncio

    from gpumon.cards.backends.demo import DemoBackend
    from gpumon.tui.app import create_app
    from gpumon.tui.widgets.status_bar import StatusBar

    async def go():
        app = create_app(DemoBackend(), interval=0.1, low_bandwidth=True)
        async with app.run_test(size=(120, 40)) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.pause(0.3)
            bar = app.main_screen.query_one(StatusBar)
            shown = bar.snapshot
            assert "low bandwidth" in bar.extra
            await pilot.pause(1.0)  # ten samples later: still the same one on screen
            assert bar.snapshot is shown and app.sampler.latest is not shown
            await pilot.press("b")
            await pilot.pause(0.5)
            assert bar.snapshot is not shown and "low bandwidth" not in bar.extra
            # The output layer says the terminal is 4 s behind: said at once; low bandwidth switches
            # on by itself when it lasts (the first frames of a slow link take seconds on their own).
            from gpumon.tui import base_app as app_module
            from gpumon.tui.wire.driver import LinkLag

            monkeypatch.setattr(app_module, "AUTO_LOW_BANDWIDTH_AFTER_S", 0.5)
            app.post_message(LinkLag(4))
            await pilot.pause(0.3)
            assert not app.low_bandwidth and "link 4 s behind" in bar.extra
            await pilot.pause(0.5)
            assert app.low_bandwidth

    asyncio.run(go())
