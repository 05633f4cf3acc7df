"""Real terminals for end-to-end tests: tmux on a private socket, typed into and read off the screen;
and a bare pseudo-terminal for reading exactly the bytes gpumon writes."""

from __future__ import annotations

import contextlib
import os
import pty
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from fcntl import ioctl
from termios import TIOCSWINSZ

import pytest


@contextlib.contextmanager
def gpumon_on_pty(env: dict[str, str], size: tuple[int, int], *args: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """`python -m gpumon ARGS` on a pseudo-terminal of `size` (columns, rows): yields the process and
    the terminal's master side. On leaving, `q` is typed and the process waited for (killed by its
    pid when it does not quit)."""
    master, slave = pty.openpty()
    ioctl(slave, TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "gpumon", *args], stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True)
    os.close(slave)
    try:
        yield proc, master
    finally:
        os.write(master, b"q")
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(master)


class Tmux:
    def __init__(self, tmux: str, width: int, height: int) -> None:
        self.tmux = tmux
        self.socket = f"gpumon-test-{uuid.uuid4().hex[:8]}"
        self.size = (width, height)

    def __call__(self, *args: str) -> str:
        return subprocess.run([self.tmux, "-L", self.socket, *args], capture_output=True, text=True,
                              check=False, timeout=20).stdout

    def start(self, command: str) -> None:
        self("new-session", "-d", "-s", "t", "-x", str(self.size[0]), "-y", str(self.size[1]), command)

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        for key in keys:
            self("send-keys", "-t", "t", key)
            time.sleep(0.15)

    def wait_for(self, predicate, timeout: float = 20.0, what: str = "") -> str:
        deadline = time.monotonic() + timeout
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; screen was:\n{screen}")
            time.sleep(0.2)

    def kill(self) -> None:
        self("kill-server")


@pytest.fixture
def tmux_session():
    """tmux_session(width, height) -> a Tmux on its own socket, killed after the test."""
    from conftest import require_tool

    sessions = []

    def make(width: int, height: int) -> Tmux:
        session = Tmux(require_tool("tmux"), width, height)
        sessions.append(session)
        return session

    yield make
    for session in sessions:
        session.kill()


TUI_ENV = ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "TZ",
           "GPUMON_CLAIMS_DIR")


def gpumon_command(env: dict[str, str], *args: str) -> str:
    """The shell command that starts this checkout's gpumon in a tmux pane, with the fake driver's
    environment (`env`: a FakeDriver's) and a colour terminal."""
    import shlex

    words = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in TUI_ENV)
    return f"env {words} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon {shlex.join(args)}"
