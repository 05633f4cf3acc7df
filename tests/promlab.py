"""A real Prometheus on loopback and what it scrapes: `gpumon watch --prometheus` exporters on fake
machines of their own, and recorded dcgm-exporter expositions served by a small static HTTP server.

Everything listens on 127.0.0.1, is started by the test (or benchmark) that uses it, and is ended
by its pid; every wait is bounded. Imported by the Prometheus fleet tests and by benchmarks/.
"""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

RECORDED = Path(__file__).parent / "recorded"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> Any:
    """Poll `check` until it returns something true; AssertionError naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last!r})")


def serve_and_scrape(argv: list[str], env: dict[str, str], port: int, ready: Callable[[str], bool],
                     timeout: float = 30) -> str:
    """Start the exporter `argv` (which serves on `port`), scrape /metrics until `ready(body)`, stop it;
    the body."""
    watch = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + timeout
        body = ""
        while not ready(body):
            assert time.monotonic() < deadline and watch.poll() is None, f"the exporter did not serve: {body[-2000:]}"
            time.sleep(0.2)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                    body = response.read().decode()
            except OSError:
                continue
    finally:
        watch.terminate()
        watch.wait(10)
    return body


class StaticServer:
    """Fixed answers by path (an exposition, or a broken answer), on a loopback port of its own.
    A body may be a function, called per request (an exposition whose timestamps follow the clock)."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[int, str, bytes | Callable[[], bytes]]] = {}
        self.requests = 0
        pages = self.pages
        server_self = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server_self.requests += 1
                path = urllib.parse.urlsplit(self.path).path
                status, kind, body = pages.get(path, (404, "text/plain", b"not found\n"))
                data = body() if callable(body) else body
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client went away (a stopped Prometheus)
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="static-server", daemon=True)
        self.thread.start()

    def page(self, path: str, body: bytes | str | Callable[[], bytes], status: int = 200,
             kind: str = "text/plain; version=0.0.4") -> None:
        self.pages[path] = (status, kind, body.encode() if isinstance(body, str) else body)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


class Prometheus:
    """A real Prometheus server (Debian's `prometheus`) with its own config and data directory.
    `users`: {user: bcrypt hash}: it demands basic auth (`--web.config.file`); `auth` is how this
    lab logs in itself."""

    def __init__(self, binary: str, workdir: Path, scrape_configs: list[dict[str, Any]],
                 scrape_interval: str = "1s", users: dict[str, str] | None = None,
                 auth: tuple[str, str] | None = None) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "prometheus.yml"
        self.config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval,
                       "scrape_timeout": scrape_interval},
            "scrape_configs": scrape_configs,
        }))
        self.web_config: Path | None = None
        if users:
            self.web_config = workdir / "web.yml"
            self.web_config.write_text(json.dumps({"basic_auth_users": users}))
        self.headers = {"Authorization": "Basic " + base64.b64encode(":".join(auth).encode()).decode()} if auth \
            else {}
        self.log = workdir / "prometheus.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> Prometheus:
        argv = [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        if self.web_config is not None:
            argv.append(f"--web.config.file={self.web_config}")
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            try:
                ready = urllib.request.Request(f"{self.url}/-/ready", headers=self.headers)
                with urllib.request.urlopen(ready, timeout=2) as answer:
                    return answer.status == 200
            except OSError:
                return False

        wait_until(ready, timeout, "Prometheus to be ready")
        return self

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(urllib.request.Request(url, headers=self.headers), timeout=10) as answer:
            return json.loads(answer.read())["data"]["result"]

    def wait_for_series(self, promql: str, count: int, timeout: float = 60) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            try:
                found = self.query(promql)
            except (OSError, ValueError, KeyError):
                return None
            return found if len(found) == count else None

        return wait_until(enough, timeout, f"{count} series of {promql}")

    def stop(self) -> None:
        if self.proc is not None:
            end(self.proc)


def end(proc: subprocess.Popen) -> None:
    """End a process this lab started (by its pid): politely, then for certain."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Exporter:
    """`gpumon watch --prometheus PORT` reading a fake machine of its own (a FakeDriver's env)."""

    def __init__(self, env: dict[str, str], hostname: str | None, processes: bool = False,
                 interval: float = 0.5) -> None:
        self.env = env
        self.hostname = hostname
        self.port = free_port()
        self.target = f"127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "gpumon", "watch", "--interval", f"{interval:g}", "--alert", "temp > 500",
                     "--prometheus", str(self.port)]
        if hostname is not None:
            self.argv += ["--prometheus-hostname", hostname]
        if processes:
            self.argv.append("--prometheus-processes")
        self.proc: subprocess.Popen | None = None

    def start(self) -> Exporter:
        self.proc = subprocess.Popen(self.argv, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)

        def serving() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"gpumon watch exited: {self.proc.stderr.read()}")
            try:
                with urllib.request.urlopen(f"http://{self.target}/metrics", timeout=2) as answer:
                    return b"DCGM_FI_DEV_GPU_TEMP{" in answer.read()
            except OSError:
                return False

        wait_until(serving, 60, f"gpumon watch --prometheus {self.port}")
        return self

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        end(self.proc)
        self.proc.stderr.close()
        return self.proc.returncode


def scrape_job(name: str, targets: list[str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"job_name": name, "static_configs": [{"targets": targets, "labels": labels or {}}]}


def exposition(collector) -> bytes:
    """What a scrape of `collector` reads, as `watch --prometheus` serves it."""
    from prometheus_client import generate_latest

    from gpumon.exporter.collector import registry_for

    return generate_latest(registry_for(collector))
