"""A small terminal (80×24): every dialog fits with all its fields and buttons on screen, the
one-line card rows keep their bars aligned whatever badge a row carries, and a command line too
long for the process table is cut with `…`, in terminal cells."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import GIB, Card
from rich.cells import cell_len
from showcase import demo_app, showcase_state, wait_for_first_frame
from textual.containers import ScrollableContainer
from textual.geometry import Region
from textual.widgets import Button, Checkbox, Input, Label

from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.screens.environment import EnvironmentScreen

LONG_COMMAND = "python train.py --model llama-7b --batch-size 32 --lr 3e-4 " * 4
ENVIRONMENT = {"CUDA_VISIBLE_DEVICES": "GPU-4744ff37-9288-b66c-f56c-20e6323a3888", "PATH": "/usr/bin:/bin" * 8,
               **{f"SETTING_{i}": "x" * (i * 7) for i in range(40)}}


def open_confirm(app) -> None:
    app.push_screen(ConfirmScreen("Send SIGTERM to process 48213?", f"alice: {LONG_COMMAND}"))


def open_environment(app) -> None:
    app.push_screen(EnvironmentScreen("Environment of 48213", ENVIRONMENT))


# The dialog, and how it is opened: keys, or (where the demo offers no process to act on) pushed.
DIALOGS = {
    "run": ("r", *"python train.py"),
    "memory limit": ("m",),
    "confirm": open_confirm,
    "environment": open_environment,
    "help": ("question_mark",),
    "alerts": ("exclamation_mark",),
    "topology": ("t",),
    "jobs": ("J",),
}


def hidden_parts(screen, size: tuple[int, int]) -> list[str]:
    """What of the dialog is not wholly on screen: its frame past the screen's edge (the screen then
    scrolls), or a field, option, button or label cut off or behind a scrollbar. Text inside a
    scrolling body (help, environment) may scroll: only the body itself must fit. A widget hidden
    for now (`display` off) is no part of the layout and is left out."""
    whole = Region(0, 0, *size)
    problems = []
    for widget in screen.query("*"):
        if not all(node.display for node in widget.ancestors_with_self if node is not screen.app):
            continue  # hidden until it has something to say (J's host queue): not laid out at all
        if any(isinstance(a, ScrollableContainer) for a in widget.ancestors) and not isinstance(
                widget, (Input, Button, Checkbox, Label)):
            continue
        geometry = screen.find_widget(widget)
        region = geometry.region
        if not whole.contains_region(region) or region.intersection(geometry.clip) != region:
            problems.append(f"{widget!r} at {region}, visible {region.intersection(geometry.clip)}")
        elif isinstance(widget, (Input, Button, Checkbox)) and not region:
            problems.append(f"{widget!r} has no room")
    return problems


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
@pytest.mark.parametrize("dialog", list(DIALOGS))
def test_every_dialog_fits_with_all_its_fields_and_buttons(dialog, size):
    async def go():
        app = demo_app()
        async with app.run_test(size=size) as pilot:
            await wait_for_first_frame(pilot)
            opening = DIALOGS[dialog]
            if callable(opening):
                opening(app)
            else:
                await pilot.press(*opening)
            await pilot.pause(0.3)
            assert app.screen is not app.main_screen
            assert hidden_parts(app.screen, size) == []

    with showcase_state():  # the demo jobs, for J
        asyncio.run(go())


def bar_spans(row: str) -> list[tuple[int, int]]:
    """Where each bar of a card row is: (first cell, after its last) of each `▕…▏`. (A bar's last
    eighth can be a `▏` too: its end is the last `▏` before the value that follows it.)"""
    return [(m.start(), m.end()) for m in re.finditer("▕[^▕0-9N]*▏", row)]


@pytest.mark.parametrize("width", [80, 100, 160])
def test_one_line_card_rows_keep_their_bars_aligned_with_and_without_an_alert_badge(tmux_session, width):
    tmux = tmux_session(width, 24)
    keep = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG", "TZ")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in os.environ.items() if k in keep)
    # The demo's two busy cards run above 70 °C, the other two below: two rows carry the badge.
    tmux.start(f"env -i {env} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon "
               f"--demo --interval 0.5 --alert 'temp > 70'; sleep 600")
    screen = tmux.wait_for(lambda s: sum("⚠" in line and "▕" in line for line in s.splitlines()) == 2,
                           what="two card rows with an alert badge")
    rows = [line for line in screen.splitlines() if "A100" in line and "▕" in line]
    assert len(rows) == 4, screen
    assert len({tuple(bar_spans(row)) for row in rows}) == 1, screen
    assert len(bar_spans(rows[0])) == 2


@pytest.mark.parametrize("width", [80, 120])
def test_a_long_command_line_with_wide_characters_is_cut_with_an_ellipsis(fake_driver, tmux_session, width):
    # A process whose command line starts with wide characters (two cells each), named so itself.
    name = "训练-" + "数据集" * 40
    proc = subprocess.Popen([name, "600"], executable=shutil.which("sleep"))
    try:
        fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB)]
        fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=GIB)]
        fake_driver.write()
        keep = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
                "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG", "TZ", "GPUMON_NVML_LIB", "FAKE_NVML_CONFIG")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items() if k in keep)
        tmux = tmux_session(width, 24)
        tmux.start(f"env -i {env} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon "
                   f"--interval 0.5; sleep 600")
        screen = tmux.wait_for(lambda s: "训练-" in s, what="the process")
    finally:
        proc.kill()
        proc.wait()
    (row,) = [line for line in screen.splitlines() if f" {proc.pid} " in line]
    assert cell_len(row) == width, row
    inside = row.rstrip("│")
    assert inside.endswith("…"), row
    shown = inside[inside.index("训练-"):-1]
    assert cell_len(shown) >= 8, row
    # Cut between characters; a wide one that did not fit whole leaves a space.
    assert name.startswith(shown) or (shown.endswith(" ") and name.startswith(shown[:-1])), row


@pytest.mark.parametrize("where", ["card", "processes", "fleet-host-processes"])
def test_every_footer_hint_fits_at_120_columns(fake_driver, idle_processes, tmux_session, where):
    """With one's own process (every action offered) and the process table focused (its own hints):
    the footer ends with `q Quit  ? Help`, never cut."""
    sleeper = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=sleeper.pid, mem=GIB, sm=10)]
    fake_driver.write()
    keep = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME",
            "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG", "TZ", "GPUMON_NVML_LIB", "FAKE_NVML_CONFIG")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items() if k in keep)
    tmux = tmux_session(120, 40)
    hosts = "--hosts local " if where.startswith("fleet") else ""
    tmux.start(f"env -i {env} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon {hosts}"
               f"--interval 0.5; sleep 600")
    if hosts:
        tmux.wait_for(lambda s: "live" in s, timeout=30, what="the fleet overview")
        tmux.keys("Enter")
    tmux.wait_for(lambda s: "sleep 600" in s and "Terminate" in s, timeout=30, what="the process, with its actions")
    if where != "card":
        tmux.keys("Tab")
        tmux.wait_for(lambda s: "Sort" in s.splitlines()[-1] or "Process" in s.splitlines()[-1],
                      what="the process table's hints")
    footer = tmux.screen().splitlines()[-1]
    assert footer.rstrip().endswith("q Quit  ? Help"), footer
