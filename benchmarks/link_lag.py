"""How far behind a monitor's screen falls on a slow link, measured in a real terminal (tmux).

The monitor runs behind benchmarks/slowlink.py (a link of RATE bytes/s that queues like sshd)
inside tmux. Every few seconds card 0's temperature is set to a new value on the fake driver (one
no other card ever shows); the lag is the time until tmux's screen shows it, so it includes the
sampling interval. Then `q`: the time until the program has ended and its output has drained.
Used by bench.py --slow-link.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

from fakenvml import FakeMachine

SLOWLINK = Path(__file__).with_name("slowlink.py")


def lag_on_link(argv: list[str], env: dict[str, str], machine: FakeMachine, config: Path, rate: float,
                size: tuple[int, int], seconds: float, python: str) -> tuple[list[float], float | None]:
    """(lags in seconds, time for q to take effect) of the program `argv` behind a RATE link."""
    tmux = shutil.which("tmux")
    if tmux is None:
        raise RuntimeError("tmux is needed for the slow-link measurement")
    socket = f"gpumon-bench-{uuid.uuid4().hex[:8]}"

    def run(*args: str) -> str:
        return subprocess.run([tmux, "-L", socket, *args], capture_output=True, text=True, timeout=20).stdout

    def set_temp(value: int) -> None:
        machine.cards[0].extra["temp"] = value
        machine.write(config)

    def shown(value: int) -> bool:
        return re.search(rf"(?<![\d.]){value}°?C\b", run("capture-pane", "-p", "-t", "t")) is not None

    set_temp(10)
    names = ("FAKE_NVML_CONFIG", "LD_LIBRARY_PATH", "PYTHONPATH", "TERM", "PATH", "HOME")
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in names)
    command = " ".join(shlex.quote(a) for a in [python, str(SLOWLINK), str(rate), "--", *argv])
    run("new-session", "-d", "-s", "t", "-x", str(size[0]), "-y", str(size[1]), f"env {exports} {command}")
    lags: list[float] = []
    try:
        deadline = time.monotonic() + 120
        while not shown(10) and time.monotonic() < deadline:
            time.sleep(0.2)
        started, value = time.monotonic(), 10
        while time.monotonic() - started < seconds:
            value = 11 + (value - 10) % 19
            set_temp(value)
            changed = time.monotonic()
            while not shown(value) and time.monotonic() - changed < 120:
                time.sleep(0.1)
            lags.append(time.monotonic() - changed)
            time.sleep(max(0.0, 3 - lags[-1]))
        run("send-keys", "-t", "t", "q")
        quit_sent = time.monotonic()
        while run("list-sessions").strip() and time.monotonic() - quit_sent < 300:
            time.sleep(0.1)
        took = time.monotonic() - quit_sent
        return lags, (took if took < 300 else None)
    finally:
        run("kill-server")
