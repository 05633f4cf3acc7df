"""XID errors reach the TUI (panels and `--alert xid`), and CUDA ordinals are shown in every
layout and are certain wherever CUDA_VISIBLE_DEVICES names cards by UUID."""

from __future__ import annotations

import asyncio

from conftest import Card

from gpumon.alerting.rules import parse_rules
from gpumon.cards.backends.demo import DemoBackend
from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.cuda_order import cuda_ordinals
from gpumon.model import GpuSample
from gpumon.tui.app import create_app
from gpumon.tui.screens.help import help_table
from gpumon.tui.widgets.card_list import CardList


def test_the_tui_listens_for_xid_errors(fake_driver):
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.xids = [dict(gpu=1, at=1.5, code=79)]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        app = create_app(backend, interval=0.3, rules=parse_rules(["xid"]))
        async with app.run_test(size=(140, 40)) as pilot:
            for _ in range(200):
                if app.engine.firing():
                    break
                await pilot.pause(0.05)
            assert app.engine.firing() == {1: ("xid",)}
            assert [(e.event, e.gpu, e.value) for e in app.alert_log] == [("firing", 1, 79.0)]
            await pilot.pause(0.5)
            panels = app.main_screen.query_one(CardList).panels
            assert "XID 79" in panels[1].lines(130)[0].plain
            assert "XID" not in panels[0].lines(130)[0].plain

    try:
        asyncio.run(go())
    finally:
        backend.close()


def test_xids_are_shown_without_any_rule(fake_driver):
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.xids = [dict(gpu=0, at=1.0, code=48)]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        app = create_app(backend, interval=0.3)
        async with app.run_test(size=(140, 40)) as pilot:
            panel = None
            for _ in range(200):
                await pilot.pause(0.05)
                panels = app.main_screen.query_one(CardList).panels
                panel = panels[0] if panels else None
                if panel is not None and panel.gpu is not None and "XID 48" in panel.lines(130)[0].plain:
                    break
            assert panel is not None and "XID 48 just now" in panel.lines(130)[0].plain

    try:
        asyncio.run(go())
    finally:
        backend.close()


def test_compact_layout_shows_the_cuda_ordinal():
    async def go():
        env = {"CUDA_VISIBLE_DEVICES": "3,1"}
        app = create_app(DemoBackend(cards=8), interval=0.2, env=env)
        async with app.run_test(size=(120, 40)) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.pause(0.3)
            panels = app.main_screen.query_one(CardList).panels
            assert panels[0].compact, "8 cards at 120x40 use the compact layout"
            lines = [p.lines(116)[0].plain for p in panels]
            assert "CUDA 0" in lines[3] and "CUDA 1" in lines[1]
            assert "no CUDA" in lines[0]

    asyncio.run(go())


def gpu(index: int, name: str) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}{index}{index}{index}-aaaa", name=name,
                     pci_bus_id=f"00000000:{0x10 + index:02X}:00.0")


def test_uuid_entries_give_certain_ordinals_on_mixed_models():
    gpus = [gpu(0, "NVIDIA A100-SXM4-80GB"), gpu(1, "NVIDIA L4"), gpu(2, "NVIDIA A100-SXM4-80GB")]
    env = {"CUDA_VISIBLE_DEVICES": "GPU-2222-aaaa,GPU-0000"}
    assert cuda_ordinals(gpus, env) == {2: "0", 0: "1", 1: "hidden"}
    # Integer entries depend on CUDA's "fastest first" order, unknown for mixed models: the UUID
    # entry is still certain, the cards an integer might name are "?".
    assert cuda_ordinals(gpus, {"CUDA_VISIBLE_DEVICES": "GPU-1111,0"}) == {1: "0", 0: "?", 2: "?"}
    assert cuda_ordinals(gpus, {"CUDA_VISIBLE_DEVICES": "0,1"}) == {0: "?", 1: "?", 2: "?"}


def test_help_explains_the_cuda_labels():
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(help_table(readonly=False))
    text = console.export_text()
    assert "CUDA ?" in text and "hidden" in text and "CUDA_DEVICE_ORDER" in text


def test_once_the_backend_is_closed_no_xid_wait_reaches_the_driver(fake_driver, monkeypatch):
    """A listener thread may still be waiting when the backend closes: shutdown leaves its event set
    dangling, so the wait in flight ends first and later ones never call the driver (a leftover
    thread once crashed the test run inside nvmlEventSetWait)."""
    import threading
    import time

    import pynvml

    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    backend.sample()  # the cards answer: they are registered for events
    calls: list[tuple[float, float]] = []
    real = pynvml.nvmlEventSetWait_v2

    def timed(*args):
        started = time.monotonic()
        try:
            return real(*args)
        finally:
            calls.append((started, time.monotonic()))

    monkeypatch.setattr(pynvml, "nvmlEventSetWait_v2", timed)
    stop = threading.Event()

    def listen() -> None:
        while not stop.is_set():
            backend.wait_xid(0.2)

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert calls, "the listener never waited in the driver"
    backend.close()
    closed_at = time.monotonic()
    time.sleep(0.7)
    stop.set()
    listener.join(2)
    assert all(ended <= closed_at for _, ended in calls), "a wait was inside the driver after close"
