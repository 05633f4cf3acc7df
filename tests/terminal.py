"""A real terminal for end-to-end tests: tmux on a private socket, typed into and read off the screen."""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest


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
