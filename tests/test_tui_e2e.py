"""The real `gpumon` command in a real terminal (tmux) against the fake driver, read off the screen."""

from __future__ import annotations

import getpass
import re
import shlex
import sys
import time
from pathlib import Path

import pytest
from conftest import GIB, Card


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
def test_real_gpumon_in_tmux(fake_driver, idle_processes, tmux_session, tmp_path, size):
    trainer = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", "--lr", "3e-4")
    server = idle_processes("sleep", "600")
    m = fake_driver.machine
    m.cards = [
        Card("Quadro RTX 8000", mem_total=48 * GIB, extra=dict(util=37, temp=58, mem_used=13 * GIB)),
        Card("Quadro RTX 8000", mem_total=48 * GIB, extra=dict(util=81, temp=71)),
        Card("Tesla P100-PCIE-16GB", mem_total=16 * GIB, extra=dict(util=12, temp=44, lost_after=6)),
    ]
    m.procs = [dict(gpu=1, pid=trainer.pid, mem=7 * GIB, sm=64), dict(gpu=0, pid=server.pid, mem=GIB)]
    fake_driver.write()
    status_file = tmp_path / "status"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items()
                   if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "TZ"))
    command = (f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --interval 0.5; "
               f"echo $? > {status_file}")
    tmux = tmux_session(*size)
    tmux.start(command)
    # The card names come first (before Textual loads), the readings with the first sample.
    screen = tmux.wait_for(lambda s: ("Tesla P100" in s or "P100-PCIE" in s) and "sleep 600" in s,
                           what="card names and their processes")

    # Every card: index, name, utilisation, memory, temperature.
    assert "RTX 8000" in screen, screen
    for needle in ("37%", "81%", "13G/48G", "58°C", "71°C"):
        assert needle in screen, needle
    # Every process: pid, user, command, GPU memory.
    me = getpass.getuser()
    for proc in (trainer, server):
        assert str(proc.pid) in screen
    assert me in screen and "7.0G" in screen
    assert "sleep 600" in screen

    # Values follow the driver.
    m.cards[0].extra["util"] = 93
    fake_driver.write()
    tmux.wait_for(lambda s: "93%" in s, what="updated utilisation")

    # A lost card says LOST; the others keep updating.
    screen = tmux.wait_for(lambda s: "LOST" in s, what="LOST card")
    m.cards[1].extra["util"] = 55
    fake_driver.write()
    tmux.wait_for(lambda s: "55%" in s and "LOST" in s, what="other cards updating after the loss")

    # Select card 1 by keys, show only its processes, filter them.
    tmux.keys("j", "a")
    screen = tmux.wait_for(lambda s: "GPU 1" in s, what="process table scoped to GPU 1")
    assert str(trainer.pid) in screen and str(server.pid) not in screen
    tmux.keys("a", "/", "3", "e", "-", "4")
    screen = tmux.wait_for(lambda s: "filter" in s and str(server.pid) not in s, what="filter applied")
    assert str(trainer.pid) in screen
    tmux.keys("Escape", "q")
    deadline = time.monotonic() + 15
    while not status_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status_file.read_text().strip() == "0"


def test_no_driver_in_tmux_says_so(tmux_session, tmp_path):
    status_file = tmp_path / "status"
    tmux = tmux_session(100, 20)
    tmux.start(f"env LD_LIBRARY_PATH={tmp_path} {shlex.quote(sys.executable)} -m gpumon 2>{tmp_path}/err; "
               f"echo $? > {status_file}")
    deadline = time.monotonic() + 20
    while not status_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status_file.read_text().strip() == "3"
    assert "--demo" in Path(tmp_path / "err").read_text()


SGR = re.compile(r"(?:\x1b\[[0-9;]*m)+")  # one change of style: one or more SGR sequences in a row


def leading_styles(line: str, upto: str) -> int:
    """How many style changes a process row has between its first cell and `upto` (its pid)."""
    row = line.split("│", 1)[1]
    return len(SGR.findall(row[:row.index(upto)]))


def test_the_cursor_row_is_painted_whole_when_the_cursor_moves(tmux_session):
    """Every cell of the row the cursor leaves loses its colour, and the row it reaches gets it,
    the first cell included (it was repainted from the second cell on)."""
    tmux = tmux_session(120, 40)
    tmux.start(f"{shlex.quote(sys.executable)} -m gpumon --demo")
    tmux.wait_for(lambda s: "48214" in s, what="the demo's processes")
    tmux.keys("Tab", "Down")
    time.sleep(1.0)
    screen = tmux("capture-pane", "-p", "-e", "-t", "t")
    rows = {pid: next(line for line in screen.splitlines() if pid in line) for pid in ("48213", "48214")}
    assert leading_styles(rows["48213"], "48213") <= 1, repr(rows["48213"])
    assert leading_styles(rows["48214"], "48214") <= 1, repr(rows["48214"])
