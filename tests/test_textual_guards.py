"""A Textual whose internals are not the ones gpumon's fast paths were written for: each path checks
at start (gpumon/tui/wire/guards.py) and, where something it uses is missing or has another shape,
Textual's own way draws the screen, and the log says why in one line.

The changed Textual is made by tests/textual_changed.py: one internal renamed (or its parameters
changed) in Textual consistently, so that Textual itself still works and only gpumon's use is stale.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

CHANGED = Path(__file__).with_name("textual_changed.py")

# The dashboard headless: which compositor and line caches drew it, whether the updates it was
# sent (as Textual's own strings) leave the screen a full render shows, and what was logged.
HEADLESS = r"""
import asyncio, json, logging
from rich.console import Console
from gpumon.cards.backends.demo import DemoBackend
from gpumon.tui.app import create_app
from gpumon.tui.wire import sgr
from gpumon.tui.wire.screen import ScreenDiff

logged = []
handler = logging.Handler()
handler.emit = lambda record: logged.append(record.getMessage())
logging.basicConfig(level=logging.INFO, handlers=[handler])
app = create_app(DemoBackend(cards=6), interval=0.1)
console = Console(color_system="256", force_terminal=True, width=120)
shown = ScreenDiff(120, 40)
display = app._display


def collect(screen, renderable):
    if hasattr(renderable, "render_segments"):
        shown.feed(renderable.render_segments(console))
    return display(screen, renderable)


app._display = collect


def cells(diff):
    return [[(c, sgr.blank(s) if c == " " else s) for c, s in zip(diff._want_text[y], diff._want_style[y])]
            for y in range(diff.height)]


def own(obj, name):  # the attribute, under the name this Textual gives it
    return getattr(obj, name, None) or getattr(obj, name + "_renamed", None)


async def scenario():
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.6)
        await pilot.press("down", "down", "s", "tab", "down")
        await pilot.pause(0.4)
        app.notify("a toast over the table")
        await pilot.pause(0.4)
        compositor = own(app.screen, "_compositor")
        full = ScreenDiff(120, 40)
        full.feed(compositor.render_update(full=True).render_segments(console))
        caches = {type(own(w, "_styles_cache")).__name__ for w in app.screen.walk_children()}
        text = "\n".join("".join(full._want_text[y]) for y in range(full.height))
        return {"compositor": type(compositor).__name__, "caches": sorted(caches),
                "same": cells(shown) == cells(full), "text": text, "logged": logged}


print(json.dumps(asyncio.run(scenario())))
"""


def run_headless(tmp_path: Path, change: str | None) -> dict:
    script = tmp_path / "headless.py"
    script.write_text(HEADLESS)
    argv = [sys.executable, *([str(CHANGED), change] if change else []), str(script)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("change, mechanism, internal", [
    ("rename:_regions_to_spans", "lean compositor", "Compositor._regions_to_spans is missing"),
    ("rename:_dirty_regions", "lean compositor", "no _compositor._dirty_regions"),
    ("rename:_compositor", "lean compositor", "no _compositor"),
    ("reshape:textual._compositor.ChopsUpdate.__init__", "lean compositor", "ChopsUpdate.__init__ takes (self, args"),
    ("rename:_styles_cache", "whole lines", "no _styles_cache"),
    ("reshape:textual._styles_cache.StylesCache.render_line", "whole lines", "render_line takes (self, args"),
])
def test_headless_a_changed_internal_leaves_textuals_own_way(tmp_path, change, mechanism, internal):
    changed = run_headless(tmp_path, change)
    assert changed["same"], "the updates sent do not leave the screen a full render shows"
    assert "A100-SXM4-80GB" in changed["text"] and "Processes" in changed["text"]
    said = [line for line in changed["logged"] if f": {mechanism} off for this run" in line]
    assert len(said) == 1 and internal in said[0], changed["logged"]
    if mechanism == "lean compositor":
        assert changed["compositor"] == "Compositor"
    else:
        assert changed["caches"] == ["StylesCache"]


def test_headless_this_textual_has_everything():
    """The installed Textual is the one the fast paths were written for: all of them are on."""
    from gpumon.tui.wire import guards

    guards.forget()
    assert {m: guards._class_problem(m) for m in guards.NEEDS} == dict.fromkeys(guards.NEEDS)


def masked(screen: str) -> list[str]:
    """The layout, not the readings (the demo's values move): numbers, bars and the gaps between
    them become one '#'."""
    return [re.sub(r"[\d ▏▎▍▌▋▊▉█.:%/°WGMK-]*[\d▏▎▍▌▋▊▉█][\d ▏▎▍▌▋▊▉█.:%/°WGMK-]*", "#", line.rstrip())
            for line in screen.splitlines()]


@pytest.mark.parametrize("change, mechanism, internal", [
    ("rename:_writer_thread", "output layer", "no _writer_thread"),
    ("rename:_get_terminal_size", "output layer", "_get_terminal_size is missing"),
    ("rename:_batch_count", "compositor updates as cells", "no _batch_count"),
    ("rename:post_display_hook", "compositor updates as cells", "post_display_hook is missing"),
    ("rename:run_input_thread", "quiet input", "run_input_thread is missing"),
    ("rename:_timeout_time", "quiet input", "XTermParser objects have no _timeout_time"),
])
def test_in_a_terminal_a_changed_internal_draws_what_gpumon_draws(tmux_session, tmp_path, change, mechanism,
                                                                   internal):
    """The same dashboard in two terminals: gpumon as it is, and under the changed Textual. Both
    screens have the same layout, also after the terminals are resized."""
    runs = {}
    for name, prefix in (("ours", []), ("changed", [str(CHANGED), change])):
        tmux = tmux_session(100, 30)
        command = shlex.join([sys.executable, *prefix, "-m", "gpumon", "--demo", "--interval", "0.3"])
        tmux.start(f"env GPUMON_LOG_FILE={tmp_path / name}.log TERM=xterm-256color {command}; "
                   f"echo $? > {tmp_path / name}.status")
        runs[name] = tmux
    for tmux in runs.values():
        tmux.wait_for(lambda s: "Processes" in s and "Quit" in s, what="the dashboard")

    def same_layout(width: int, height: int) -> None:
        drawn = "╭" + "─" * (width - 2) + "╮"  # the cards' box, drawn for this width
        ours = runs["ours"].wait_for(lambda s: len(s.splitlines()) == height and drawn in s,
                                     what=f"gpumon at {width}x{height}")
        runs["changed"].wait_for(lambda s: masked(s) == masked(ours), timeout=15,
                                 what=f"the changed Textual's screen to look like:\n{ours}")

    same_layout(100, 30)
    for tmux in runs.values():
        tmux("resize-window", "-t", "t", "-x", "80", "-y", "24")
    same_layout(80, 24)
    for name, tmux in runs.items():
        tmux.keys("q")
    for name in runs:
        status = tmp_path / f"{name}.status"
        runs[name].wait_for(lambda s: status.exists(), what=f"{name} to quit")
        assert status.read_text().strip() == "0"
    logged = (tmp_path / "changed.log").read_text().splitlines()
    said = [line for line in logged if f": {mechanism} off for this run" in line]
    assert len(said) == 1 and internal in said[0], logged
    assert "off for this run" not in (tmp_path / "ours.log").read_text()


@pytest.mark.parametrize("change", ["rename:_restart_blink", "rename:_forward_event"])
def test_in_a_terminal_the_filter_edits_under_a_changed_textual(tmux_session, tmp_path, change):
    """The filter box is a plain Input on Textual's public API (no `_restart_blink`, no
    `_forward_event`, no `_on_key` of its own): with those internals renamed in Textual, typing,
    Backspace and Enter in it work, and gpumon runs on."""
    status = tmp_path / "status"
    tmux = tmux_session(120, 40)
    command = shlex.join([sys.executable, str(CHANGED), change, "-m", "gpumon", "--demo", "--interval", "0.3"])
    tmux.start(f"env TERM=xterm-256color {command}; echo $? > {status}; sleep 600")
    tmux.wait_for(lambda s: "python train.py" in s, what="the dashboard")
    tmux("send-keys", "-t", "t", "-l", "/pythx", ";", "send-keys", "-t", "t", "BSpace", ";",
         "send-keys", "-t", "t", "-l", "on", ";", "send-keys", "-t", "t", "Enter")
    screen = tmux.wait_for(lambda s: "filter “python”" in s or status.exists(), what="the filter edited")
    assert not status.exists(), f"gpumon ended ({status.read_text().strip()}):\n{screen}"
    assert "python train.py" in screen
    tmux.keys("Escape", "q")
    tmux.wait_for(lambda s: status.exists(), what="gpumon to quit")
    assert status.read_text().strip() == "0"
