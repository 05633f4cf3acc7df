"""A hung or slow card delays only itself: the other cards keep their interval, one-off commands
answer within --timeout, the TUI draws before the driver answers, and `t` shows what it has."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import threading
import time

from conftest import GIB, Card

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import Sampler
from gpumon.tui.app import create_app
from gpumon.tui.screens.topology import TopologyScreen
from gpumon.tui.widgets.card_list import CardList


def lanes() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("gpumon-card-"))


def one_slow_card(machine, slow_ms: int = 1500) -> None:
    """Card 1's every call takes slow_ms (a card going bad); cards 0 and 2 are healthy."""
    machine.cards = [Card(extra=dict(util="10..90")), Card(extra=dict(slow=slow_ms, util=50)),
                     Card(extra=dict(util=30))]


def test_a_slow_card_delays_only_itself(fake_driver):
    one_slow_card(fake_driver.machine)
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    sampler = Sampler(backend, interval=0.3)
    published: list = []
    sampler.subscribe(published.append)
    before = lanes()
    most = 0

    async def go():
        nonlocal most
        task = asyncio.create_task(sampler.run())
        end = time.monotonic() + 6.0
        while time.monotonic() < end:
            await asyncio.sleep(0.1)
            most = max(most, lanes() - before)
        sampler.stop()
        await task

    try:
        asyncio.run(go())
    finally:
        backend.close()
    fresh = [s for s in published if not s.stale and s.gpus[0].state == "ok"]
    assert len(fresh) >= 8, f"healthy cards updated {len(fresh)} times in 6 s at a 0.3 s interval"
    last = published[-1]
    assert [g.state for g in last.gpus] == ["ok", "stale", "ok"]
    slow = last.gpus[1]
    assert slow.stale_s >= 3 and "not responding" in slow.error
    assert most <= 3, "never more than one stuck call (one lane) per card"


def test_snapshot_answers_within_timeout_with_the_slow_card_marked(fake_driver):
    one_slow_card(fake_driver.machine, slow_ms=2000)
    fake_driver.write()
    started = time.monotonic()
    out = fake_driver.run("snapshot", "--json", "--timeout", "2")
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert took < 7, f"took {took:.1f} s"  # 2 s, plus starting Python on a loaded machine
    gpus = json.loads(out.stdout)["gpus"]
    assert [g["state"] for g in gpus] == ["ok", "stale", "ok"]
    assert gpus[1]["stale_s"] >= 1.5 and gpus[0]["stale_s"] is None
    assert gpus[0]["utilization_gpu"] is not None
    text = fake_driver.run("snapshot", "--timeout", "1").stdout
    assert "GPU 1: not responding for" in text


def test_select_answers_within_timeout_and_skips_the_slow_card(fake_driver):
    one_slow_card(fake_driver.machine, slow_ms=2000)
    fake_driver.machine.cards[0].extra.update(util=0, mem_used=GIB)
    fake_driver.machine.cards[2].extra.update(util=0, mem_used=2 * GIB)
    fake_driver.write()
    started = time.monotonic()
    out = fake_driver.run("select", "--count", "2", "--timeout", "2", "--verbose")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 8
    assert "GPU 1 skipped: not responding" in out.stderr
    assert len(out.stdout.strip().split(",")) == 2


def test_topo_answers_within_timeout_and_leaves_the_slow_card_out(fake_driver):
    one_slow_card(fake_driver.machine, slow_ms=2000)
    fake_driver.machine.nvlinks = [(0, 2, 4)]
    fake_driver.write()
    started = time.monotonic()
    out = fake_driver.run("topo", "--timeout", "2")
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 7
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["GPU0", "GPU2"] and lines[1].split()[:3] == ["GPU0", "X", "NV4"]
    assert "GPU1 left out: not responding" in out.stdout


def test_tui_first_frame_comes_before_the_driver_answers(fake_driver, tmux_session):
    # nvmlInit itself takes 4 s (a machine with persistence mode off): the screen must not stay blank.
    fake_driver.machine.cards = [Card("NVIDIA H100 80GB HBM3")]
    fake_driver.machine.delays = {"nvmlInitWithFlags": 4000}
    fake_driver.write()
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items()
                   if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "TZ"))
    tmux = tmux_session(120, 30)
    started = time.monotonic()
    tmux.start(f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --interval 0.5")
    screen = tmux.wait_for(lambda s: "opening the NVIDIA driver" in s, timeout=3.5, what="the first frame")
    assert time.monotonic() - started < 3.9 and "H100" not in screen
    tmux.wait_for(lambda s: "H100 80GB" in s, timeout=20, what="the card, once the driver answers")


def test_tui_shows_the_slow_card_on_its_own_panel(fake_driver):
    one_slow_card(fake_driver.machine)
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        app = create_app(backend, interval=0.3)
        async with app.run_test(size=(140, 40)) as pilot:
            panels = app.main_screen.query_one(CardList).panels if app.main_screen.is_attached else []
            for _ in range(150):
                await pilot.pause(0.05)
                panels = app.main_screen.query_one(CardList).panels
                if len(panels) == 3 and panels[1].gpu is not None and panels[1].gpu.state == "stale" \
                        and (panels[1].gpu.stale_s or 0) >= 4:
                    break
            text = [" ".join(line.plain for line in p.lines(130)) for p in panels]
            assert "not responding for" in text[1]
            assert "not responding" not in text[0] and "not responding" not in text[2]
            status = app.main_screen.query_one("#status").render().plain
            assert "STALE" not in status  # the trouble is that card's, not the driver's

    try:
        asyncio.run(go())
    finally:
        backend.close()


def test_topology_view_opens_at_once_and_fills_in(fake_driver):
    fake_driver.machine.cards = [Card(), Card(), Card(extra=dict(slow=300))]
    fake_driver.machine.nvlinks = [(0, 1, 4)]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        app = create_app(backend, interval=0.3)
        async with app.run_test(size=(120, 40)) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.press("t")
            await pilot.pause(0.1)
            # Measured against the slow card's own reading, not a clock (on a loaded machine a second
            # may pass): the view is up while the links are still being read.
            assert isinstance(app.screen, TopologyScreen), "the view opens before the links are read"
            screen = app.screen
            assert screen.reading and screen.topo.indices[:2] == (0, 1)  # card 2 may still be opening
            for _ in range(600):
                if not screen.reading:
                    break
                await pilot.pause(0.05)
            assert not screen.reading and screen.topo.indices == (0, 1, 2) and screen.topo.links[0][1] == "NV4"
            assert screen.topo.links[2][0] is not None, "the slow card's links arrive too"

    try:
        asyncio.run(go())
    finally:
        backend.close()


def test_quitting_never_waits_for_a_hung_card(fake_driver):
    # A guarantee kept from before the lanes: a call that hangs for 20 s holds up nothing at exit.
    fake_driver.machine.cards = [Card(), Card(extra=dict(slow=20000))]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go() -> float:
        app = create_app(backend, interval=0.3)
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause(1.0)  # card 1 is stuck in its first call by now
            started = time.monotonic()
            await pilot.press("q")
        return time.monotonic() - started

    took = asyncio.run(go())
    closing = time.monotonic()
    backend.close()
    assert took < 3 and time.monotonic() - closing < 2
