"""The TUI's dialogs and overlays as a user meets them: the run dialog's Enter and working
directory, `m`'s explanation, `s` in J asking first, confirmations that quote other users' command
lines, and the dashboard that keeps updating behind an overlay."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

import psutil
import pytest
from conftest import GIB, Card
from rich.text import Text
from test_tui import launch_app, nvml_app, run, started  # noqa: F401 - fixtures used by name

from gpumon.cards.backends.demo import DemoBackend
from gpumon.jobs import records
from gpumon.tui.app import create_app
from gpumon.tui.jobs.screen import JobsScreen
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.screens.help import HelpScreen
from gpumon.tui.screens.run_dialog import MemLimitDialog, RunDialog
from gpumon.tui.widgets.card_list import CardList
from gpumon.tui.widgets.process_table import ProcessTable


async def wait_until(pilot, predicate, seconds: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


def test_enter_on_a_checkbox_launches(launch_app, tmp_path):  # noqa: F811
    app = launch_app
    out = tmp_path / "out"

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", *f"echo hi > {out}", "tab", "tab", "tab")
            assert app.screen.focused.id == "run-numa"
            await pilot.press("enter")
            assert not isinstance(app.screen, RunDialog), "Enter on a checkbox must launch, not toggle"
            await wait_until(pilot, lambda: out.exists() and out.read_text(), what="the job")
        (job,) = records.list_jobs()
        assert job.spec.numa, "the checkbox kept its value"

    run(go())


def test_enter_on_cancel_cancels(launch_app):  # noqa: F811
    app = launch_app

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", *"true")
            app.screen.query_one("#run-cancel").focus()
            await pilot.press("enter")
            assert not isinstance(app.screen, RunDialog)
        assert records.list_jobs() == []

    run(go())


def test_a_bad_working_directory_is_shown_in_the_dialog_and_the_command_kept(launch_app, tmp_path):  # noqa: F811
    app = launch_app
    missing = tmp_path / "no-such-dir"

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", *"python train.py --epochs 3")
            app.screen.query_one("#run-cwd").value = str(missing)
            await pilot.press("enter")
            assert isinstance(app.screen, RunDialog), "the dialog stays, with what was typed"
            error = str(app.screen.query_one("#run-error").render())
            assert "does not exist" in error and str(missing) in error
            assert app.screen.query_one("#run-command").value == "python train.py --epochs 3"
            assert app.screen.focused.id == "run-cwd"
        assert records.list_jobs() == []

    run(go())


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
def test_the_memory_limit_explanation_fits_at_every_width(size):
    async def go():
        app = create_app(DemoBackend(), interval=0.1, backend_args={"demo": "default"})
        async with app.run_test(size=size) as pilot:
            await started(pilot)
            await pilot.press("m")
            assert isinstance(pilot.app.screen, MemLimitDialog)
            await pilot.pause(0.2)
            body = pilot.app.screen.query_one("#limit-body")
            label = body.query_one("Label")
            inside = body.content_region
            assert inside.contains_region(label.region), (label.region, inside)
            text = Text(str(label.render()))
            needed = len(text.wrap(pilot.app.console, label.region.width))
            assert label.region.height >= needed, "every line of the explanation is shown"

    run(go())


def test_s_in_jobs_asks_before_stopping(launch_app):  # noqa: F811
    app = launch_app

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", *"sleep 30", "enter")
            await wait_until(pilot, lambda: [j for j in records.list_jobs() if j.state == "running"], what="the job")
            await pilot.press("J")
            assert isinstance(app.screen, JobsScreen)
            await pilot.press("s")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")
            await pilot.pause(0.5)
            assert isinstance(app.screen, JobsScreen) and records.list_jobs()[0].state == "running"
            await pilot.press("s", "y")
            await wait_until(pilot, lambda: records.list_jobs()[0].state == "killed", what="the job to stop")
            assert records.list_jobs()[0].reason == "stopped by the user"

    run(go())


def test_a_confirmation_shows_a_command_line_as_text_not_markup(nvml_app, fake_driver, idle_processes):  # noqa: F811
    app, _ = nvml_app()
    hostile = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", "[/]", "[bold red]boo[/bold red]")
    fake_driver.machine.procs = [dict(gpu=1, pid=hostile.pid, mem=3 * GIB, sm=10)]
    fake_driver.write()

    async def go():
        async with app.run_test(size=(160, 40)) as pilot:
            screen = await started(pilot)
            await pilot.press("tab")
            await wait_until(pilot, lambda: screen.query_one(ProcessTable).selected_row is not None and
                             screen.query_one(ProcessTable).selected_row.process.pid == hostile.pid, what="the row")
            await pilot.press("x")
            assert isinstance(app.screen, ConfirmScreen)
            detail = str(app.screen.query_one("#confirm-detail").render())
            assert "[/] [bold red]boo[/bold red]" in detail
            await pilot.press("n")

    run(go())
    assert hostile.poll() is None


def test_the_dashboard_keeps_updating_behind_an_overlay(fake_driver):
    from gpumon.cards.backends.nvml import NvmlBackend

    fake_driver.machine.cards = [Card("NVIDIA A10", extra=dict(util=37)), Card("NVIDIA A10", extra=dict(util=12))]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    app = create_app(backend, interval=0.2)

    def panel_text() -> str:
        return "".join(line.plain for line in app.main_screen.query_one(CardList).panels[0].lines(100))

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            assert "37%" in panel_text()
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            fake_driver.machine.cards[0].extra["util"] = 93
            fake_driver.write()
            await wait_until(pilot, lambda: "93%" in panel_text(), seconds=12, what="the card behind the help")
            assert isinstance(app.screen, HelpScreen)

    try:
        run(go())
    finally:
        backend.close()


def terminal_bytes(keys: bytes, seconds: float) -> int:
    """Bytes the real gpumon --demo writes to a 120x40 pseudo-terminal in `seconds`, after `keys`."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "gpumon", "--demo", "--interval", "0.5"], stdin=slave, stdout=slave,
                            stderr=slave, env=dict(os.environ, TERM="xterm-256color"), start_new_session=True)
    os.close(slave)

    def drain(until: float, seen: bytes | None = None) -> int:
        """Bytes read until `until`; with `seen`, until those bytes have come (or 60 s: a loaded machine)."""
        count, tail = 0, b""
        deadline = time.monotonic() + 60 if seen is not None else until
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.1)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:
                    break
                count += len(chunk)
                if seen is not None and seen in tail + chunk:
                    return count
                tail = (tail + chunk)[-len(seen or b""):]
        return count

    try:
        # Measured from after the first frame and the overlay are drawn, however long they take.
        drain(0, seen=b"demo")
        drain(time.monotonic() + 2)
        os.write(master, keys)
        if keys == b"?":
            drain(0, seen=b"gpumon keys")
        drain(time.monotonic() + 1.5)
        return drain(time.monotonic() + seconds)
    finally:
        for child in psutil.Process(proc.pid).children(recursive=True):
            child.kill()
        proc.kill()
        proc.wait()
        os.close(master)


def test_updating_behind_an_overlay_costs_less_than_the_dashboard_alone():
    """Textual repaints the whole screen for any change behind a modal: it must not do so every sample."""
    alone = terminal_bytes(b"", 6)
    behind_help = terminal_bytes(b"?", 6)
    assert 0 < behind_help <= alone, (behind_help, alone)
