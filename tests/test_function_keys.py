"""The keys of the field (htop, nvtop, btop) beside gpumon's own, sent by a real terminal (tmux):
F1 help, F3 filter, F6 sort (and s without first Tab-ing into the table), F9 the signal menu, F10 quit."""

from __future__ import annotations

import shlex
import sys
import time

from conftest import GIB, Card


def _header(screen: str) -> str:
    return next(line for line in screen.splitlines() if "GPU MEM" in line and "PID" in line)


def test_function_keys_in_a_real_terminal(fake_driver, idle_processes, tmux_session, tmp_path):
    sleeper = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.machine.procs = [dict(gpu=0, pid=sleeper.pid, mem=GIB, sm=5)]
    fake_driver.write()
    status = tmp_path / "status"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items()
                   if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
                            "TZ"))
    tmux = tmux_session(120, 40)
    tmux.start(f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --interval 0.5; "
               f"echo $? > {status}")
    screen = tmux.wait_for(lambda s: "sleep 600" in s, what="the process")
    assert "GPU MEM▼" in _header(screen)

    tmux.keys("s")  # the card list has the focus: s still sorts the processes
    tmux.wait_for(lambda s: "SM%▼" in _header(s), what="s sorting by SM%")
    tmux.keys("F6")
    tmux.wait_for(lambda s: "CPU%▼" in _header(s), what="F6 sorting by CPU%")

    tmux.keys("F1")
    tmux.wait_for(lambda s: "F9" in s and "choose a signal" in s, what="F1: the help")
    tmux.keys("F1")
    tmux.wait_for(lambda s: "choose a signal" not in s, what="F1 closing the help")

    tmux.keys("F3")
    tmux.wait_for(lambda s: "filter processes" in s, what="F3: the filter box")
    tmux.keys("Escape", "Tab")

    tmux.keys("F9")
    tmux.wait_for(lambda s: f"Send a signal to process {sleeper.pid}" in s and "SIGKILL" in s, what="F9: the menu")
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "Send a signal" not in s, what="the menu closing")
    assert sleeper.poll() is None  # nothing was sent

    tmux.keys("F10")
    deadline = time.monotonic() + 15
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.read_text().strip() == "0"
