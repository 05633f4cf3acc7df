"""Faults a monitor meets when something is already wrong, on the fake driver: hung calls, no
cards, thousands of processes, hostile or undecodable command lines, unknown users."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import pytest
from conftest import GIB, Card

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.tui.app import create_app
from gpumon.tui.widgets.card_list import CardList
from gpumon.tui.widgets.process_table import ProcessTable


def run(coro):
    return asyncio.run(coro)


def with_backend(fake_driver, body):
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        return run(body(backend))
    finally:
        backend.close()


def test_tui_with_no_cards_says_so_and_quits(fake_driver):
    async def body(backend):
        app = create_app(backend, interval=0.2)
        async with app.run_test(size=(80, 24)) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.pause(0.3)
            assert "no cards" in str(app.main_screen.query_one("#no-cards").render())
            await pilot.press("j", "a", "t", "escape", "q")
        return app.return_value

    assert with_backend(fake_driver, body) == 0


def test_hung_card_keeps_the_ui_live_marks_that_card_and_recovers(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(util=11)), Card(extra=dict(util=22))]

    async def body(backend):
        app = create_app(backend, interval=0.2)
        async with app.run_test(size=(120, 40)) as pilot:
            while app.main_screen.snapshot is None:  # the first reading drawn, not only read
                await pilot.pause(0.05)
            panels = app.main_screen.query_one(CardList).panels
            fake_driver.machine.cards[0].extra.update(slow=2500, util=77)  # card 0's calls hang
            fake_driver.machine.cards[1].extra["util"] = 33
            fake_driver.write()
            for _ in range(200):
                if panels[0].gpu.state == "stale" and panels[1].gpu.utilization_gpu == 33:
                    break
                await pilot.pause(0.05)
            await pilot.press("j")  # answered while the call hangs
            assert app.main_screen.query_one(CardList).selected == 1
            assert "not responding for" in panels[0].lines(110)[0].plain
            assert panels[1].gpu.state == "ok" and panels[1].gpu.utilization_gpu == 33  # the other card goes on
            fake_driver.machine.cards[0].extra["slow"] = 0
            fake_driver.write()
            for _ in range(300):
                if panels[0].gpu.state == "ok" and panels[0].gpu.utilization_gpu == 77:
                    break
                await pilot.pause(0.05)
            assert panels[0].gpu.state == "ok" and panels[0].gpu.utilization_gpu == 77

    with_backend(fake_driver, body)


def test_two_thousand_processes_on_one_card(fake_driver):
    # Pids from another namespace (not visible here): the table must stay cheap and responsive.
    fake_driver.machine.cards = [Card(mem_total=80 * GIB), Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=4_000_000 + i, mem=(i % 50 + 1) << 20) for i in range(2000)]

    async def body(backend):
        app = create_app(backend, interval=0.5)
        async with app.run_test(size=(120, 40)) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.pause(0.3)
            table = app.main_screen.query_one(ProcessTable)
            assert table.row_count == 2000
            rendered = []
            original = table.render_line
            table.render_line = lambda y: rendered.append(y) or original(y)
            table.refresh()
            await pilot.pause(0.2)
            assert 0 < len(rendered) <= 4 * table.size.height  # on-screen lines per frame, not 2000 rows
            await pilot.press("tab", "end")
            assert table.cursor == 1999 and table.selected_row is not None
            await pilot.press("home")
            assert table.cursor == 0

    with_backend(fake_driver, body)


def test_hostile_undecodable_and_huge_command_lines(fake_driver, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import time; time.sleep(600)\n")
    hostile = os.fsencode("\x1b]0;pwned\x07\x1b[2J") + b"\xff\xfe-caf\xc3\xa9"
    child = subprocess.Popen([os.fsencode(sys.executable), os.fsencode(script), hostile, b"A" * 20000])
    try:
        fake_driver.machine.cards = [Card()]
        fake_driver.machine.procs = [dict(gpu=0, pid=child.pid, mem=GIB)]
        fake_driver.write()
        out = fake_driver.run("snapshot", "--json")
        assert out.returncode == 0, out.stderr
        command = json.loads(out.stdout)["gpus"][0]["processes"][0]["command"]
        assert "\x1b" not in command and "\x07" not in command
        assert "\\x1b]0;pwned\\x07" in command and "\ufffd" in command and "café" in command
        assert command.endswith("A" * 20000)
        table = fake_driver.run("snapshot")
        assert table.returncode == 0 and "\x1b" not in table.stdout

        async def body(backend):
            app = create_app(backend, interval=0.3)
            async with app.run_test(size=(100, 30)) as pilot:
                while app.sampler.latest is None:
                    await pilot.pause(0.05)
                await pilot.pause(0.3)
                table_widget = app.main_screen.query_one(ProcessTable)
                assert "\\x1b]0;pwned" in table_widget.cell_text(0, "command")
                assert "\x1b" not in table_widget.render_line(1).text

        with_backend(fake_driver, body)
    finally:
        child.kill()
        child.wait()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process under a uid with no passwd entry")
def test_user_that_does_not_resolve(fake_driver):
    child = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: os.setuid(54321))  # noqa: PLW1509 - test only
    try:
        fake_driver.machine.cards = [Card()]
        fake_driver.machine.procs = [dict(gpu=0, pid=child.pid, mem=GIB)]
        fake_driver.write()
        doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
        process = doc["gpus"][0]["processes"][0]
        assert process["user"] == "54321" and process["command"] == "sleep 60"
    finally:
        child.kill()
        child.wait()


def test_watch_rides_out_a_hung_call(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(temp=95))]
    fake_driver.machine.delays = {"nvmlDeviceGetTemperature": 1500}
    fake_driver.write()
    started = time.monotonic()
    out = fake_driver.run("watch", "--alert", "temp > 90", "--interval", "0.2", "--count", "20", "--metrics")
    assert out.returncode == 0
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    # Samples keep their interval while the card's call hangs; the alert fires once, when the card
    # answers, and is not fired again by the same answer re-used while the next call is under way.
    assert [line["event"] for line in lines].count("sample") == 20
    assert [line["event"] for line in lines].count("firing") == 1
    assert time.monotonic() - started < 15


def test_driver_upgraded_in_the_tui_is_exit_3(fake_driver):
    fake_driver.machine.init_error = 18
    fake_driver.write()
    out = fake_driver.run()
    assert out.returncode == 3 and "driver was upgraded" in out.stderr and "Traceback" not in out.stderr
