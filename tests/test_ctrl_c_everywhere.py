"""Ctrl-C leaves gpumon from every screen and dialog, at once, with the status it has on the main
screen (130, as a shell reports a command it interrupted): in a real terminal (tmux), the real
`gpumon` over the fake driver, and the fleet TUI over its demo."""

from __future__ import annotations

import shlex
import sys
import time

import pytest
from conftest import Card

# From the key until the shell has the status: a quit waits for nothing (test_fleet_tui_leaving.py
# measures ~0.4 s); the rest is room for a loaded 2-core machine. A Ctrl-C a screen swallows never ends.
LEAVE_S = 6.0

# The key that opens each screen or dialog, and what shows it is open.
SCREENS = {
    "jobs": ("J", "PEAK MEM"),
    "topology": ("t", "Topology"),
    "help": ("?", "gpumon keys"),
    "health": ("h", "Health · GPU 0"),
    "mem-limit": ("m", "Memory limit for jobs"),
    "run": ("r", "Enter launches"),
    "users": ("u", "IDLE"),
    "process": (("Tab", "Enter"), "Back"),
    "alerts": ("!", "lert"),
}


def _start(tmux_session, tmp_path, env: dict[str, str], *args: str):
    keep = ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "TZ", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
            "XDG_DATA_HOME", "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG")
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in keep)
    status = tmp_path / "status"
    tmux = tmux_session(120, 40)
    tmux.start(f"env -i {assignments} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon "
               f"{shlex.join(args)} --interval 0.5; echo $? > {status}; sleep 600")
    return tmux, status


def _ctrl_c_leaves(tmux, status) -> None:
    started = time.monotonic()
    tmux("send-keys", "-t", "t", "C-c")
    while not status.exists() and time.monotonic() - started < LEAVE_S:
        time.sleep(0.05)
    assert status.exists(), f"still running {LEAVE_S:g} s after Ctrl-C; screen:\n{tmux.screen()}"
    assert status.read_text().strip() == "130"


@pytest.mark.parametrize("where", list(SCREENS))
def test_ctrl_c_leaves_from_every_screen_and_dialog(fake_driver, idle_processes, tmux_session, tmp_path, where):
    sleeper = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=sleeper.pid, mem=2 << 30)]
    fake_driver.write()
    tmux, status = _start(tmux_session, tmp_path, fake_driver.env)
    tmux.wait_for(lambda s: "A100" in s and "sleep 600" in s, timeout=30, what="the card and its process")
    keys, shown = SCREENS[where]
    tmux.keys(*([keys] if isinstance(keys, str) else keys))
    tmux.wait_for(lambda s: shown in s, what=f"the {where} screen")
    _ctrl_c_leaves(tmux, status)


@pytest.mark.parametrize("where", ["jobs", "help"])
def test_ctrl_c_leaves_the_fleet_tui_from_its_screens(tmux_session, tmp_path, where):
    import os

    tmux, status = _start(tmux_session, tmp_path, dict(os.environ), "--hosts", "local", "--demo")
    tmux.wait_for(lambda s: "live" in s, timeout=30, what="the fleet overview")
    keys, shown = SCREENS[where]
    tmux.keys(*([keys] if isinstance(keys, str) else keys))
    tmux.wait_for(lambda s: shown in s, what=f"the {where} screen")
    _ctrl_c_leaves(tmux, status)
