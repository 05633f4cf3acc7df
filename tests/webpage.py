"""The web page's harness: the real `gpumon serve` as a child process, plain HTTP to it, and Debian's
Chromium driven by playwright (never a browser playwright downloads).

    with Served(argv, env) as served:      # reads the URL it prints; SIGTERM and status 0 at the end
        status, headers, body = get(served.base + "/api/snapshot")
        page = browser.new_page(); page.goto(served.url)
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import require_tool

# Headless, and nothing that reaches out of this machine (updates, sync, QUIC probes).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    executable = require_tool("chromium")  # Debian's: skipped without it here, a failure in CI
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy


def get(url: str, headers: dict[str, str] | None = None, method: str = "GET",
        timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one plain request, errors included."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


class Served:
    """`gpumon serve …` running; `url` is what it printed, `base` the same server on 127.0.0.1."""

    def __init__(self, argv: list[str], env: dict[str, str], timeout: float = 60) -> None:
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.line = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise AssertionError(f"gpumon serve printed no URL within {timeout} s: {self.proc.stderr.read()}")
        found = re.search(r"(https?)://(\S+?):(\d+)/(\S*)", self.line)
        assert found, self.line
        self.url = found.group(0)
        self.port = int(found.group(3))
        self.base = f"{found.group(1)}://127.0.0.1:{self.port}"
        self.token = found.group(4).removeprefix("?token=") or None

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> tuple[int, str]:
        """Ends it by its pid; (exit status, stderr)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            status = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"gpumon serve did not end within {timeout} s of signal {sig}") from None
        return status, self.proc.stderr.read()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            status, errors = self.stop()
            if exc[0] is None:
                assert status == 0 and not errors.strip(), (status, errors)


def until(condition, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
