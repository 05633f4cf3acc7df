"""Leaving gpumon leaves the terminal as it was, in a real terminal (tmux) and byte for byte on a
pseudo-terminal: after `q`, Ctrl-C, SIGTERM or a crash, the shell's screen, its content and its
cursor are those from before gpumon started."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest
from terminal import Tmux, gpumon_on_pty

BEFORE = "printf 'one\\ntwo\\npartial'"  # the cursor ends mid-line, after earlier output
# A bug in the app, injected: `?` raises. (What is tested is how gpumon leaves, not the bug.)
CRASH = """
import sys
from gpumon.tui import app
def broken(self):
    raise RuntimeError("injected crash")
app.GpumonApp.action_help = broken
from gpumon.cli import main
sys.exit(main(sys.argv[1:]))
"""


def wait_for_file(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} was not written")
        time.sleep(0.1)
    return path.read_text().strip()


def cursor(tmux: Tmux) -> tuple[int, int]:
    x, y = tmux("display", "-p", "-t", "t", "#{cursor_x} #{cursor_y}").split()
    return int(x), int(y)


def start(tmux: Tmux, tmp_path: Path, program: list[str], *args: str) -> tuple[str, tuple[int, int]]:
    """Some output, then gpumon once the test has read the screen; returns that screen and cursor."""
    keep = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
            "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG", "XDG_DATA_HOME", "TZ")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in os.environ.items() if k in keep)
    go, pid, status = (shlex.quote(str(tmp_path / name)) for name in ("go", "pid", "status"))
    gpumon = f"env -i {env} TERM=xterm-256color LANG=C.UTF-8 {shlex.join(program)} {shlex.join(args)}"
    tmux.start(f"{BEFORE}; while [ ! -e {go} ]; do sleep 0.05; done; "
               f"sh -c 'echo $$ > {pid}; exec {gpumon}'; echo $? > {status}; sleep 600")
    screen = tmux.wait_for(lambda s: "partial" in s, what="the shell's output")
    time.sleep(0.3)
    before = tmux.screen(), cursor(tmux)
    assert before[0] == screen and before[1] == (7, 2), before
    (tmp_path / "go").touch()
    return before


@pytest.mark.parametrize("how", ["q", "ctrl-c", "sigterm", "crash", "fleet-q"])
def test_leaving_restores_the_shells_screen_and_cursor(tmux_session, tmp_path, how):
    tmux = tmux_session(100, 30)
    program = [sys.executable, "-m", "gpumon"]
    if how == "crash":
        (tmp_path / "crash.py").write_text(CRASH)
        program = [sys.executable, str(tmp_path / "crash.py")]
    args = ("--hosts", "local", "--demo") if how.startswith("fleet") else ("--demo",)
    screen_before, cursor_before = start(tmux, tmp_path, program, *args, "--interval", "0.5")
    tmux.wait_for(lambda s: ("A100" in s or "live" in s) and "partial" not in s, what="the dashboard")
    time.sleep(1.0)  # a few frames drawn: the cursor Textual leaves behind is somewhere else
    if how in ("q", "fleet-q"):
        tmux.keys("q")
    elif how == "ctrl-c":
        tmux.keys("C-c")
    elif how == "sigterm":
        os.kill(int(wait_for_file(tmp_path / "pid")), signal.SIGTERM)
    else:
        tmux.keys("?")
    expected = {"q": 0, "fleet-q": 0, "ctrl-c": 130, "sigterm": 128 + signal.SIGTERM, "crash": 70}[how]
    assert int(wait_for_file(tmp_path / "status")) == expected
    time.sleep(0.3)
    screen, where = tmux.screen(), cursor(tmux)
    if how != "crash":
        assert (screen, where) == (screen_before, cursor_before)
        return
    # A bug: one line, where the shell's cursor was; nothing above it touched.
    lines, lines_before = screen.splitlines(), screen_before.splitlines()
    assert lines[:2] == lines_before[:2]
    assert re.fullmatch(r"partialgpumon: internal error: RuntimeError: injected crash \(GPUMON_DEBUG=1 .*\)",
                        lines[2] + lines[3] if len(lines[2]) == 100 else lines[2]), screen
    assert "Traceback" not in screen and "╭" not in screen, screen


def test_the_alternate_screen_is_entered_once_and_the_cursor_left_where_the_terminal_restores_it(tmp_path):
    """Byte for byte: the first frame (drawn before Textual) and Textual share one alternate screen
    (entering it twice saves the wrong cursor in xterm and most terminals), and nothing moves the
    cursor once the terminal has left it."""
    env = dict(os.environ, TERM="xterm-256color")
    with gpumon_on_pty(env, (100, 30), "--demo", "--interval", "0.5") as (proc, master):
        out = b""
        deadline = time.monotonic() + 30
        while b"A100" not in out and time.monotonic() < deadline:
            out += os.read(master, 65536)
        time.sleep(1.0)
        os.write(master, b"q")
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the other side has closed
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(20) == 0
    assert out.count(b"\x1b[?1049h") == 1 and out.count(b"\x1b[?1049l") == 1
    after = out.split(b"\x1b[?1049l", 1)[1]
    assert not re.search(rb"\x1b\[[0-9;]*[HABCDGdf]|\x1b[78]|[\r\n\b]", after), after
