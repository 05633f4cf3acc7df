"""Two real users for usage tests (fixture `two_users`): made with useradd, removed with userdel
afterwards; their processes run with runuser, so /proc says whose they are, as on a shared server."""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator

import psutil
import pytest
from conftest import IN_CI, require_tool


class TwoUsers:
    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.names = (f"gpumon-a{tag}", f"gpumon-b{tag}")
        self._runners: list[subprocess.Popen] = []
        self._pids: list[int] = []

    def spawn(self, name: str) -> int:
        """A real process of user `name` (sleep 600); its pid (runuser's child, running as them)."""
        runner = subprocess.Popen(["runuser", "-u", name, "--", "sleep", "600"])
        self._runners.append(runner)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                for child in psutil.Process(runner.pid).children():
                    if child.username() == name and child.cmdline()[:1] == ["sleep"]:
                        self._pids.append(child.pid)
                        return child.pid
            except psutil.Error:
                pass
            time.sleep(0.01)
        raise AssertionError(f"runuser did not start a process of {name}")

    def end(self) -> None:
        for runner in self._runners:  # runuser first: it would print "Killed" for its child
            runner.kill()
            runner.wait()
        killed = []
        for pid in self._pids:
            try:
                proc = psutil.Process(pid)
                proc.kill()
                killed.append(proc)
            except psutil.Error:
                pass
        # Until they are gone: userdel refuses a user who still runs a process, and leaves them behind.
        psutil.wait_procs(killed, timeout=10)


@pytest.fixture
def two_users() -> Iterator[TwoUsers]:
    for tool in ("useradd", "userdel", "runuser"):
        require_tool(tool)
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("these tests make users: CI runs them as root")
        pytest.skip("needs root to make users")
    users = TwoUsers()
    made = []
    try:
        for name in users.names:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                           capture_output=True)
            made.append(name)
        yield users
    finally:
        users.end()
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
