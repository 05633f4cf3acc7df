"""The TUI's choices kept for the next start (tui/preferences.py): the real gpumon in tmux over the
fake driver changes its sort, theme, chart window and scope, quits, and starts again with them;
--theme wins; a corrupt file and a read-only state folder are said in the status line and change
nothing else. Then the store itself: types, two gpumons' changes, a folder that cannot be written."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GIB, IN_CI, Card, require_tool

from gpumon.tui.preferences import Preferences, PreferenceStore


def _header(screen: str) -> str:
    return next(line for line in screen.splitlines() if "GPU MEM" in line and "PID" in line)


@pytest.fixture
def start_gpumon(fake_driver, idle_processes, tmux_session, tmp_path):
    """start_gpumon(*options, wrap="") -> a Tmux showing a real gpumon over the fake driver (one card,
    two real processes), and the file its exit status goes to; `wrap` runs it under another command."""
    first = idle_processes("sleep", "600")
    second = idle_processes("sleep", "601")
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB), Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.machine.procs = [dict(gpu=0, pid=first.pid, mem=3 * GIB, sm=20),
                                 dict(gpu=1, pid=second.pid, mem=GIB, sm=60)]
    fake_driver.write()
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items()
                   if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
                            "GPUMON_CLAIMS_DIR", "TZ"))
    runs = []

    def start(*options: str, wrap: str = ""):
        status = tmp_path / f"status-{len(runs)}"
        tmux = tmux_session(160, 45)  # wide enough for the charts beside the cards
        gpumon = f"{shlex.quote(sys.executable)} -m gpumon --interval 0.5 {' '.join(options)}"
        if wrap:
            gpumon = f"{wrap} {shlex.quote(gpumon)}"
        tmux.start(f"env {env} TERM=xterm-256color {gpumon}; echo $? > {status}")
        tmux.wait_for(lambda s: "sleep 60" in s, what="the processes")
        runs.append(status)
        return tmux, status

    return start


def quit_and_wait(tmux, status: Path) -> None:
    tmux.keys("q")
    deadline = time.monotonic() + 15
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.read_text().strip() == "0"


def saved_file(tmp_path_state: str) -> Path:
    return Path(tmp_path_state) / "gpumon" / "tui.json"


def wait_for_file(path: Path, predicate, what: str) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            data = json.loads(path.read_text())
            if predicate(data):
                return data
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what} in {path}")


def test_choices_are_kept_for_the_next_start(start_gpumon, fake_driver):
    prefs = saved_file(fake_driver.env["XDG_STATE_HOME"])
    tmux, status = start_gpumon()
    assert "GPU MEM▼" in _header(tmux.screen())
    tmux.keys("s", "S")  # SM%, then smallest first
    tmux.wait_for(lambda s: "SM%▲" in _header(s), what="the sort")
    tmux.keys("c")
    tmux.wait_for(lambda s: "theme: gpumon-light" in s, what="the light theme")
    tmux.keys("w")
    tmux.wait_for(lambda s: "-5m" in s, what="5 minute charts")
    tmux.keys("a")
    tmux.wait_for(lambda s: "Processes · GPU 0 · 1" in s, what="only the selected card's processes")
    wait_for_file(prefs, lambda d: d.get("all_cards") is False and d.get("window") == 300, "the choices")
    quit_and_wait(tmux, status)

    tmux, status = start_gpumon()
    screen = tmux.wait_for(lambda s: "-5m" in s and "Processes · GPU 0" in s, what="the window and scope again")
    assert "SM%▲" in _header(screen)
    tmux.keys("c")  # the light theme was in force: the next one is high-contrast
    tmux.wait_for(lambda s: "theme: high-contrast" in s, what="the theme after gpumon-light")
    quit_and_wait(tmux, status)

    tmux, status = start_gpumon("--theme", "gpumon-dark")  # the command line wins over the saved theme
    tmux.keys("c")
    tmux.wait_for(lambda s: "theme: gpumon-light" in s, what="the theme after gpumon-dark")
    assert "SM%▲" in _header(tmux.screen()), "the other choices still apply"
    quit_and_wait(tmux, status)


def test_a_corrupt_file_is_said_and_ignored(start_gpumon, fake_driver):
    prefs = saved_file(fake_driver.env["XDG_STATE_HOME"])
    prefs.parent.mkdir(parents=True, exist_ok=True)
    prefs.write_text('{"sort": "sm", oops')
    tmux, status = start_gpumon()
    screen = tmux.wait_for(lambda s: "preferences ignored (not JSON: line 1)" in s, what="the status line")
    assert "GPU MEM▼" in _header(screen) and "Traceback" not in screen
    tmux.keys("s")  # the next choice replaces the broken file
    tmux.wait_for(lambda s: "SM%▼" in _header(s), what="the sort")
    assert wait_for_file(prefs, lambda d: d.get("sort") == "sm", "the new choice")["sort_reverse"] is True
    quit_and_wait(tmux, status)


def test_a_read_only_state_folder_does_not_stop_the_tui(start_gpumon, fake_driver, tmp_path):
    """The state folder on a file system mounted read-only (a mount namespace of its own)."""
    unshare = require_tool("unshare")
    if subprocess.run([unshare, "--user", "--map-root-user", "--mount", "true"], capture_output=True).returncode:
        if IN_CI:
            pytest.fail("user and mount namespaces are needed in CI")
        pytest.skip("user and mount namespaces are not allowed here")
    state = Path(fake_driver.env["XDG_STATE_HOME"])
    saved_file(str(state)).parent.mkdir(parents=True, exist_ok=True)
    saved_file(str(state)).write_text(json.dumps({"sort": "pid", "sort_reverse": False}))
    # Bind the folder over itself read-only: what was saved can be read, nothing can be written.
    wrap = (f"{unshare} --user --map-root-user --mount sh -c "
            f"'mount --bind {state} {state} && mount -o remount,bind,ro {state} {state} && exec sh -c \"$0\"'")
    tmux, status = start_gpumon(wrap=wrap)
    assert "PID▲" in _header(tmux.screen()), "read from the read-only folder"
    tmux.keys("s")
    screen = tmux.wait_for(lambda s: "preferences not saved (Read-only file system)" in s, what="the status line")
    assert "USER▲" in _header(screen) and "Traceback" not in screen
    tmux.keys("s")
    tmux.wait_for(lambda s: "AGE▼" in _header(s), what="keys still working")
    quit_and_wait(tmux, status)
    assert json.loads(saved_file(str(state)).read_text())["sort"] == "pid"


# -- the store --

def test_values_of_the_wrong_type_are_left_out_and_said(tmp_path):
    path = tmp_path / "tui.json"
    path.write_text(json.dumps({"sort": "cpu", "window": "600", "all_cards": 1, "theme": "gpumon-light",
                                "from_a_newer_gpumon": [1]}))
    store = PreferenceStore.load(path)
    assert store.saved == Preferences(sort="cpu", theme="gpumon-light")
    assert "window" in store.problem and "all_cards" in store.problem


def test_not_an_object_is_ignored(tmp_path):
    path = tmp_path / "tui.json"
    path.write_text("[1, 2]")
    store = PreferenceStore.load(path)
    assert store.saved == Preferences() and "not a JSON object" in store.problem


def wait_written(path: Path, predicate) -> dict:
    return wait_for_file(path, predicate, "the write")


def test_two_gpumons_keep_each_others_choices(tmp_path):
    path = tmp_path / "state" / "tui.json"
    one, other = PreferenceStore.load(path), PreferenceStore.load(path)
    one.change(theme="gpumon-light")
    wait_written(path, lambda d: d.get("theme") == "gpumon-light")
    other.change(window=600)  # knows nothing of the theme: it keeps it
    assert wait_written(path, lambda d: d.get("window") == 600) == {"theme": "gpumon-light", "window": 600}
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_folder_that_cannot_be_written_is_said_once(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    store = PreferenceStore.load(blocker / "gpumon" / "tui.json")
    said = []
    store.on_problem = said.append
    store.change(sort="sm")
    store.change(sort="cpu")
    deadline = time.monotonic() + 5
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # the second write has had its chance to say it again
    assert len(said) == 1 and "preferences not saved" in said[0]
    assert store.saved.sort == "cpu", "kept in memory"


def test_the_fleet_overviews_sort_is_kept(tmp_path):
    """The fleet TUI (a stand-in fleet) keeps its overview's sort in the same file."""
    import asyncio

    from fleet_scenes import card, machine, scene_fleet

    from gpumon.tui.fleet.app import FleetApp

    path = tmp_path / "state" / "tui.json"

    async def session(keys: tuple[str, ...]) -> str:
        fleet = scene_fleet(["gpu01", "gpu02"])
        app = FleetApp(fleet, preferences=PreferenceStore.load(path))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.1)
            for host in ("gpu01", "gpu02"):
                fleet.report(host, "live", snapshot=machine(host, [card(0, host=host)]))
            await pilot.press(*keys)
            await pilot.pause(0.2)
            return f"{app.overview.table.sort_key} {app.overview.table.sort_reverse}"

    assert asyncio.run(session(("o", "o", "O"))) == "load True"
    wait_for_file(path, lambda d: d.get("hosts_sort") == "load" and d.get("hosts_sort_reverse") is True, "the sort")
    assert asyncio.run(session(())) == "load True"


def test_the_users_views_sort_is_kept(tmp_path):
    """`u`, then `s` `s` `S`: the next start's users view opens sorted the same way."""
    import asyncio

    from gpumon.cards.backends.demo import DemoBackend
    from gpumon.tui.app import create_app

    path = tmp_path / "state" / "tui.json"

    async def session(keys: tuple[str, ...]) -> str:
        app = create_app(DemoBackend(), interval=0.2, preferences=PreferenceStore.load(path))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("u")
            while not app.users_screen.table.is_mounted:
                await pilot.pause(0.05)
            await pilot.press(*keys)
            await pilot.pause(0.2)
            table = app.users_screen.table
            return f"{table.sort_key} {table.sort_reverse}"

    assert asyncio.run(session(())) == "who False"
    assert asyncio.run(session(("s", "s", "S"))) == "mem False"
    wait_for_file(path, lambda d: d.get("users_sort") == "mem" and d.get("users_sort_reverse") is False, "the sort")
    assert asyncio.run(session(())) == "mem False"
