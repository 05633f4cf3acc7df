"""What a start does not load: the TUI watching this machine's cards, and `watch` without
--prometheus, import neither the views and actions nobody has opened yet nor the exporter, the
fleet, the web page or the AMD/Intel readers of a machine without such cards (memory and
start-up). Structural, not timed: the real program runs on the fake driver, and its sys.modules is
read when it leaves."""

from __future__ import annotations

import importlib.util
import json
import os
import pty
import select
import socket
import struct
import subprocess
import sys
import time
from fcntl import ioctl
from pathlib import Path
from termios import TIOCSWINSZ

from conftest import Card

# Runs gpumon as `python -m gpumon` does, and writes the modules it had loaded when it left; with
# OPEN_OUT, also those it had loaded when it started opening the driver (its thread "gpumon-open").
RUN_AND_LIST = """
import atexit, json, os, runpy, sys, threading
atexit.register(lambda: open(os.environ["MODULES_OUT"], "w").write(json.dumps(sorted(sys.modules))))

def noting_start(thread, start=threading.Thread.start):
    if thread.name == "gpumon-open" and os.environ.get("OPEN_OUT"):
        open(os.environ["OPEN_OUT"], "w").write(json.dumps(sorted(sys.modules)))
    return start(thread)

threading.Thread.start = noting_start
sys.argv = ["gpumon", *sys.argv[1:]]
runpy.run_module("gpumon", run_name="__main__", alter_sys=True)
"""

NEVER_AT_START = [  # loaded when first needed: a key, --prometheus, --hosts, an AMD card
    "gpumon.cards.backends.drm.backend", "gpumon.cards.backends.drm.fdinfo", "gpumon.exporter.collector",
    "gpumon.exporter.serving", "prometheus_client", "gpumon.fleet", "gpumon.web", "aiohttp",
    # Package metadata brings email, zipfile and csv: read only to name Textual's version in a log line.
    "importlib.metadata",
    # OpenSSL (4.4 MiB resident): asyncio would import ssl only to be ready for TLS, which only
    # `gpumon serve` speaks through it; a random file name needs os.urandom, not secrets' hashlib.
    "ssl", "_hashlib",
]
VIEWS = [  # the TUI's views and actions, each opened by a key
    "gpumon.tui.screens.health", "gpumon.tui.screens.topology", "gpumon.tui.screens.users",
    "gpumon.tui.screens.help", "gpumon.tui.screens.alerts", "gpumon.tui.jobs.screen",
    "gpumon.tui.screens.run_dialog", "gpumon.tui.screens.confirm", "gpumon.tui.screens.environment",
    "gpumon.tui.jobs.host_list", "gpumon.jobs.launch", "gpumon.jobs.claims_and_queue",
]
# Charts (plotext) are drawn only beside full panels on a wide terminal.
TUI_NEVER_AT_START = NEVER_AT_START + VIEWS + ["gpumon.tui.fleet.app", "plotext"]


def _modules_of(env: dict[str, str], tmp_path: Path, *args: str, tui: bool) -> list[str]:
    out = tmp_path / "modules.json"
    env = dict(env, MODULES_OUT=str(out), TERM="xterm-256color")
    argv = [sys.executable, "-c", RUN_AND_LIST, *args]
    if not tui:
        subprocess.run(argv, env=env, capture_output=True, timeout=60, check=True)
        return json.loads(out.read_text())
    master, slave = pty.openpty()
    ioctl(slave, TIOCSWINSZ, struct.pack("HHHH", 30, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True)
    os.close(slave)
    try:
        screen, deadline = b"", time.monotonic() + 30
        # The first sample drawn: the process table lists the card's process.
        while b"Processes" not in screen or b"sleep" not in screen:
            assert time.monotonic() < deadline and proc.poll() is None, screen[-400:]
            if select.select([master], [], [], 0.1)[0]:
                screen += os.read(master, 65536)
        os.write(master, b"q")
        proc.wait(15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    return json.loads(out.read_text())


def _assert_lazy(loaded: list[str], never: list[str]) -> None:
    # Each name is a module that exists here, so the check cannot pass by a misspelling.
    missing = [name for name in never if name not in ("aiohttp",) and importlib.util.find_spec(name) is None]
    assert not missing, missing
    early = [name for name in loaded if name in never or any(name.startswith(n + ".") for n in never)]
    assert not early, early


def test_the_tui_on_one_machine_loads_no_view_or_action_before_it_is_asked_for(fake_driver, idle_processes, tmp_path):
    sleeper = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card("NVIDIA H100 80GB HBM3")]
    fake_driver.machine.procs = [dict(gpu=0, pid=sleeper.pid, mem=1 << 30)]
    fake_driver.write()
    loaded = _modules_of(fake_driver.env, tmp_path, "--interval", "0.5", tui=True)
    assert "gpumon.tui.screens.main" in loaded and "textual" in loaded  # it ran, and drew the dashboard
    _assert_lazy(loaded, TUI_NEVER_AT_START)


def test_the_driver_opens_before_the_rest_of_the_start_is_imported(fake_driver, idle_processes, tmp_path):
    """The first frame with the card names waits for the driver, which the start opens once it has
    read the config file: the event loop, the config's rules, the job records and Textual are
    imported after it, while the names are drawn (names no later than nvitop's). Read at
    the moment the driver's thread starts, which does not depend on how loaded the machine is."""
    sleeper = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card("NVIDIA H100 80GB HBM3")]
    fake_driver.machine.procs = [dict(gpu=0, pid=sleeper.pid, mem=1 << 30)]
    fake_driver.write()
    open_out = tmp_path / "at-open.json"
    _modules_of(dict(fake_driver.env, OPEN_OUT=str(open_out)), tmp_path, "--interval", "0.5", tui=True)
    at_open = json.loads(open_out.read_text())
    assert "gpumon.config" in at_open and "gpumon.cli.open_driver_early" in at_open
    _assert_lazy(at_open, ["asyncio", "textual", "gpumon.tui", "gpumon.alerting", "gpumon.jobs",
                           "gpumon.sharing", "gpumon.usage"])


def test_the_views_load_when_first_opened():
    """The other half: what the start leaves out still comes when asked for (the modules exist and
    import on their own, as a key's action imports them)."""
    code = ("import importlib, sys\n"
            f"for name in {VIEWS!r}: importlib.import_module(name)\n"
            "print('ok')")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip() == "ok"


def test_watch_without_prometheus_loads_no_exporter_and_no_tui(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card("NVIDIA H100 80GB HBM3")]
    fake_driver.write()
    loaded = _modules_of(fake_driver.env, tmp_path, "watch", "--interval", "0.2", "--count", "2",
                         "--alert", "temp > 200", tui=False)
    assert "gpumon.alerting.watch" in loaded and "gpumon.cards.backends.nvml.backend" in loaded
    _assert_lazy(loaded, NEVER_AT_START + ["textual", "gpumon.tui"])


def test_watch_with_prometheus_loads_the_exporter(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card("NVIDIA H100 80GB HBM3")]
    fake_driver.write()
    with socket.socket() as probe:  # a port free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loaded = _modules_of(fake_driver.env, tmp_path, "watch", "--interval", "0.2", "--count", "2",
                         "--prometheus", f"127.0.0.1:{port}", tui=False)
    assert "gpumon.exporter.collector" in loaded and "prometheus_client" in loaded
