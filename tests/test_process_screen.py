"""Enter on a process: its own screen (screens/process.py) over the fake driver with real processes,
driven by Textual's pilot: what it shows (as text, never markup), its charts, acting on the process
from there, the process exiting while shown, and back to the main screen as it was."""

from __future__ import annotations

import re
import signal
import sys

import pytest
from conftest import GIB, Card
from terminal import gpumon_command
from test_tui import run, started
from test_tui_dialogs import wait_until

from gpumon.cards.backends.demo import DemoBackend
from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.tui.app import create_app
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.screens.main import MainScreen
from gpumon.tui.screens.process import ProcessScreen
from gpumon.tui.widgets.process_table import ProcessTable

ODD_ARG = "--tag=[bold]red[/bold]\x1b[31m\x07"  # markup and control characters in a real argv


@pytest.fixture
def two_processes(fake_driver, idle_processes):
    """An app on the fake driver listing two real processes: a sleep on card 0 and, on card 1, a
    Python whose command line holds markup and control characters."""
    sleeper = idle_processes("sleep", "600")
    odd = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", ODD_ARG)
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB), Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.machine.procs = [dict(gpu=0, pid=sleeper.pid, mem=3 * GIB, sm=20),
                                 dict(gpu=1, pid=odd.pid, mem=GIB, sm=60)]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    yield create_app(backend, interval=0.2), sleeper, odd
    backend.close()


async def open_process(pilot, pid: int) -> ProcessScreen:
    """Tab into the process table, move to `pid`, Enter."""
    app = pilot.app
    await pilot.press("tab")
    table = app.main_screen.query_one(ProcessTable)
    for _ in range(table.row_count):
        if table.selected_row.process.pid == pid:
            break
        await pilot.press("down")
    assert table.selected_row.process.pid == pid
    await pilot.press("enter")
    await wait_until(pilot, lambda: isinstance(app.screen, ProcessScreen), what="the process screen")
    return app.screen


def test_the_process_screen_shows_the_process_as_text_and_charts_it(two_processes):
    app, sleeper, odd = two_processes

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await wait_until(pilot, lambda: len(app.main_screen.process_history) == 2, what="both processes")
            screen = await open_process(pilot, odd.pid)
            svg = app.export_screenshot()
            # The whole command line, markup shown as characters and control characters made visible.
            assert "--tag=[bold]red[/bold]\\x1b[31m\\x07" in screen.process.command
            assert "[bold]red[/bold]" in svg.replace("&#160;", " ")
            assert "\x1b" not in svg and "\x07" not in svg
            me = app.main_screen.query_one(ProcessTable).me
            for needle in (f"Process {odd.pid}", me, "Started", "GPU 1: 1.0G GPU memory, SM 60%", "Owner"):
                assert needle in svg.replace("&#160;", " "), needle
            # Its charts fill in sample by sample from the history the main screen keeps.
            await wait_until(pilot, lambda: len(screen.track) >= 2, what="points")
            assert [c.metric for c in screen.charts] == ["proc_mem", "proc_sm", "proc_cpu"]
            assert screen.charts[1].values[-1] == 60
            assert screen.charts[0].values[-1] == 1024  # MiB

    run(go())


def test_terminate_from_the_process_screen_then_it_says_the_process_exited(two_processes):
    app, sleeper, odd = two_processes
    notes = []

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            screen = await open_process(pilot, odd.pid)
            assert screen.check_action("signal", ("terminate",)) is True
            await pilot.press("x")
            await wait_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the question")
            await pilot.press("y")
            await wait_until(pilot, lambda: odd.poll() is not None, what="the process to end")
            odd.wait()
            await wait_until(pilot, lambda: screen.gone, what="the screen to notice")
            assert app.screen is screen and "exited" in app.export_screenshot()
            assert screen.check_action("signal", ("kill",)) is False
            assert screen.check_action("environment", ()) is False
            app.notify = lambda message, **kw: notes.append(message)
            await pilot.press("X")
            assert app.screen is screen, "nothing to confirm: the process is gone"
            last = screen.process
            await pilot.pause(0.5)
            assert screen.process is last, "its last values stay"
            await pilot.press("escape")
            assert isinstance(app.screen, MainScreen)

    run(go())
    assert odd.returncode == -signal.SIGTERM
    assert any("has exited" in n for n in notes), notes
    assert sleeper.poll() is None


def test_escape_returns_to_the_same_selection(two_processes):
    app, sleeper, odd = two_processes

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await open_process(pilot, odd.pid)
            await pilot.pause(0.5)  # samples arrive meanwhile
            await pilot.press("q")  # q goes back here, it does not quit
            assert isinstance(app.screen, MainScreen) and app.is_running
            table = app.main_screen.query_one(ProcessTable)
            assert table.selected_row.process.pid == odd.pid and app.screen.focused is table
            await pilot.press("enter")
            assert isinstance(app.screen, ProcessScreen) and app.screen.process.pid == odd.pid

    run(go())


def test_enter_on_the_cards_opens_nothing(two_processes):
    app, *_ = two_processes

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("enter")  # the card list has the focus
            assert isinstance(app.screen, MainScreen)

    run(go())


def test_demo_processes_say_they_are_not_real():
    app = create_app(DemoBackend(), interval=0.1)
    notes = []

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("tab", "enter")
            assert isinstance(app.screen, ProcessScreen)
            app.notify = lambda message, **kw: notes.append(message)
            for key in ("x", "f9", "e"):
                await pilot.press(key)
                assert isinstance(app.screen, ProcessScreen)

    run(go())
    assert len(notes) == 3 and all("is simulated" in n for n in notes), notes


def test_the_process_screen_in_a_real_terminal(fake_driver, idle_processes, tmux_session, tmp_path):
    """The real gpumon in tmux: Enter on a process shows it, q comes back to it selected, x
    terminates it from there, and the screen then says it exited."""
    sleeper = idle_processes("sleep", "600")
    odd = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", ODD_ARG)
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.machine.procs = [dict(gpu=0, pid=sleeper.pid, mem=3 * GIB, sm=20),
                                 dict(gpu=0, pid=odd.pid, mem=GIB, sm=60)]
    fake_driver.write()
    tmux = tmux_session(120, 40)
    tmux.start(gpumon_command(fake_driver.env, "--interval", "0.5"))
    tmux.wait_for(lambda s: "sleep 600" in s and str(odd.pid) in s, what="both processes")
    tmux.keys("Tab", "Down", "Enter")  # the second row: the odd one (less GPU memory)
    screen = tmux.wait_for(lambda s: f"Process {odd.pid}" in s and "GPU memory 1024 MiB" in s, what="its screen")
    assert "--tag=[bold]red[/bold]\\x1b[31m\\x07" in screen, screen  # text, control characters made visible
    for needle in ("Started", "ago)", "GPU 0: 1.0G GPU memory, SM 60%", "Host memory", "-1m"):
        assert needle in screen, needle

    tmux.keys("q")  # back, not quit
    tmux.wait_for(lambda s: "GPU MEM" in s and "Process " + str(odd.pid) not in s, what="the main screen")
    tmux.keys("Enter")  # the selection was kept: the same process again
    tmux.wait_for(lambda s: f"Process {odd.pid}" in s, what="the same process again")

    tmux.keys("x")
    tmux.wait_for(lambda s: f"Send SIGTERM to process {odd.pid}?" in s, what="the question")
    tmux.keys("y")
    assert odd.wait(10) == -signal.SIGTERM
    tmux.wait_for(lambda s: "exited" in s and f"Process {odd.pid}" in s, what="the screen saying it exited")
    assert sleeper.poll() is None
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "GPU MEM" in s and "sleep 600" in s, what="the main screen again")


def test_a_fleet_hosts_process_has_its_screen_too():
    """In a host's view (a stand-in fleet: the host's news is reported by the test), Enter opens the
    host's process; its charts fill from the host's readings; `e` says it is this machine's only;
    a host that is away is no news, a reading without the process says it exited."""
    import dataclasses

    from fleet_scenes import card, machine, scene_fleet

    from gpumon.model import ProcessSample
    from gpumon.tui.fleet.app import FleetApp
    from gpumon.tui.fleet.host_screen import HostScreen

    fleet = scene_fleet(["gpu01"])
    now = 1_767_225_600.0

    def report(when: float, sm: int | None, state: str = "live") -> None:
        process = ProcessSample(4242, "compute", gpu_memory=8 * GIB, sm_util=sm, user="alice", started=now - 3600,
                                command="python train.py [red]x[/red]")
        gpu = dataclasses.replace(card(0, util=90, host="gpu01"), processes=() if sm is None else (process,))
        fleet.report("gpu01", state, snapshot=machine("gpu01", [gpu], time=when))

    notes = []

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.1)
            report(now, 40)
            await pilot.pause(0.4)
            await pilot.press("enter")
            assert isinstance(app.screen, HostScreen)
            host_view = app.screen
            await pilot.pause(0.3)
            await pilot.press("tab", "enter")
            await wait_until(pilot, lambda: isinstance(app.screen, ProcessScreen), what="the process screen")
            screen = app.screen
            assert "python train.py [red]x[/red]" in app.export_screenshot().replace("&#160;", " ")
            report(now + 1, 55)
            await wait_until(pilot, lambda: screen.charts[1].values[-2:] == [40, 55], what="the host's readings")
            app.notify = lambda message, **kw: notes.append(message)
            await pilot.press("e")
            report(now + 2, None, state="stale")  # away: no news of the process (not that it exited)
            await pilot.pause(0.3)
            assert not screen.gone
            report(now + 3, None)  # a fresh reading without it
            await wait_until(pilot, lambda: screen.gone, what="the screen to say it exited")
            await pilot.press("escape")
            assert app.screen is host_view

    run(go())
    assert any("this machine's processes only" in n for n in notes), notes


def _rightmost_axis_labels(screen: str) -> list[str]:
    """The y-axis labels (top to bottom) of the rightmost chart on the screen: the number before
    the last tick mark `┤` of each line that has one."""
    labels = []
    for line in screen.splitlines():
        ticks = re.findall(r"([\d.]+)┤", line)
        if ticks:
            labels.append(ticks[-1])
    return labels


def test_a_flat_zero_cpu_chart_is_labelled_from_0_to_100_percent(fake_driver, idle_processes, tmux_session):
    """An idle process: its CPU chart's axis reads 100 / 50 / 0 (%), not 1 / 1 / 0."""
    sleeper = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.machine.procs = [dict(gpu=0, pid=sleeper.pid, mem=3 * GIB, sm=20)]
    fake_driver.write()
    tmux = tmux_session(120, 40)
    tmux.start(gpumon_command(fake_driver.env, "--interval", "0.5") + "; sleep 600")
    tmux.wait_for(lambda s: "sleep 600" in s, what="the process")
    tmux.keys("Tab", "Enter")
    screen = tmux.wait_for(lambda s: f"Process {sleeper.pid}" in s and re.search(r"\bCPU 0%", s), what="its charts")
    assert re.search(r"GPU memory .*SM .*CPU 0%", screen), screen  # the CPU chart is the rightmost
    assert _rightmost_axis_labels(screen) == ["100", "50", "0"], screen
