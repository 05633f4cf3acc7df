"""What the Prometheus source trusts, and what it does not, read through a real Prometheus on
loopback: two scrape targets that name the same host, DCGM's "blank" values, dcgm-exporter 2.x's
bare labels, and credentials (a Prometheus that demands basic auth; the password from the
environment, a file or ~/.netrc, never shown, never sent to another host on a redirect). The
expositions are written in dcgm-exporter's format and served by a small static HTTP server."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import require_tool
from promlab import Prometheus, StaticServer
from test_cli import assert_one_line_error

from gpumon.fleet import Fleet, PrometheusSource
from gpumon.model import HostStatus

MIB = 1 << 20
USER, PASSWORD = "gpumon", "s3cret-Pa55"
# bcrypt of PASSWORD at cost 4 (Prometheus checks it on every request), made once with crypt(3).
PASSWORD_HASH = "$2b$04$.rDqK07Sg9BvI8S1VfITqOiHXdbNdghRhJf6rcpB5AaOVDnBnEvoK"

# dcgm-exporter's HELP texts and types, as it prints them.
METRICS = {
    "DCGM_FI_DEV_SM_CLOCK": ("SM clock frequency (in MHz).", "gauge"),
    "DCGM_FI_DEV_MEM_CLOCK": ("Memory clock frequency (in MHz).", "gauge"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("Memory temperature (in C).", "gauge"),
    "DCGM_FI_DEV_GPU_TEMP": ("GPU temperature (in C).", "gauge"),
    "DCGM_FI_DEV_POWER_USAGE": ("Power draw (in W).", "gauge"),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("Power management limit (in W).", "gauge"),
    "DCGM_FI_DEV_FAN_SPEED": ("Fan speed (in %).", "gauge"),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("Total number of bytes transmitted through PCIe TX (in KB).", "counter"),
    "DCGM_FI_DEV_GPU_UTIL": ("GPU utilization (in %).", "gauge"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("Memory utilization (in %).", "gauge"),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("Total number of double-bit volatile ECC errors.", "counter"),
    "DCGM_FI_DEV_FB_FREE": ("Framebuffer memory free (in MiB).", "gauge"),
    "DCGM_FI_DEV_FB_USED": ("Framebuffer memory used (in MiB).", "gauge"),
}


def card(gpu: int, uuid: str, host: str | None, model: str = "NVIDIA A100-SXM4-80GB", **values: str) -> dict:
    """One card's series: dcgm-exporter 3.x's labels in its order, values by metric (without DCGM_FI_DEV_)."""
    labels = {"gpu": str(gpu), "UUID": uuid, "pci_bus_id": f"00000000:{7 + gpu:02X}:00.0", "device": f"nvidia{gpu}",
              "modelName": model}
    if host is not None:
        labels["Hostname"] = host
    labels["DCGM_FI_DRIVER_VERSION"] = "535.129.03"
    return {"labels": labels, "values": {f"DCGM_FI_DEV_{k}": v for k, v in values.items()}}


def exposition(*cards: dict) -> str:
    lines = []
    for metric, (doc, kind) in METRICS.items():
        series = [c for c in cards if metric in c["values"]]
        if series:
            lines += [f"# HELP {metric} {doc}", f"# TYPE {metric} {kind}"]
        for c in series:
            labels = ",".join(f'{k}="{v}"' for k, v in c["labels"].items())
            lines.append(f"{metric}{{{labels}}} {c['values'][metric]}")
    return "\n".join(lines) + "\n"


def target(static: StaticServer, path: str, instance: str) -> dict:
    return {"targets": [f"127.0.0.1:{static.port}"], "labels": {"__metrics_path__": path, "instance": instance}}


def gpumon(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumon", *args], capture_output=True, text=True, timeout=90,
                          env=env)


def hosts_of(out: subprocess.CompletedProcess[str]) -> dict[str, dict]:
    assert out.returncode == 0, out.stderr
    return {h["host"]: h for h in json.loads(out.stdout)["hosts"]}


@pytest.fixture
def started():
    """Everything a test starts, ended afterwards by pid (Prometheus) or closed (servers)."""
    things: list = []
    yield things
    for thing in reversed(things):
        (thing.stop if isinstance(thing, Prometheus) else thing.close)()


# -- two scrape targets that name the same host --

A0, A1 = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-aaaaaaaa-0000-4000-8000-000000000001"
B0, C0 = "GPU-bbbbbbbb-0000-4000-8000-000000000000", "GPU-cccccccc-0000-4000-8000-000000000000"


def test_two_targets_naming_one_host_with_different_cards_are_two_hosts(tmp_path, started):
    prometheus = require_tool("prometheus")
    static = StaticServer()
    started.append(static)
    # One container image on two nodes: both exporters say Hostname "gpu-node", each of its own cards.
    static.page("/a", exposition(card(0, A0, "gpu-node", GPU_TEMP="41", FB_USED="100", FB_FREE="900"),
                                 card(1, A1, "gpu-node", GPU_TEMP="42", FB_USED="200", FB_FREE="800")))
    static.page("/b", exposition(card(0, B0, "gpu-node", GPU_TEMP="51", FB_USED="300", FB_FREE="700")))
    # One node scraped under two names (by IP and by DNS name): the same card, one host.
    static.page("/c", exposition(card(0, C0, "node-c", GPU_TEMP="61", FB_USED="400", FB_FREE="600")))
    server = Prometheus(prometheus, tmp_path, [{"job_name": "dcgm", "static_configs": [
        target(static, "/a", "10.0.0.1:9400"), target(static, "/b", "10.0.0.2:9400"),
        target(static, "/c", "10.0.0.3:9400"), target(static, "/c", "node-c:9400")]}])
    started.append(server.start())
    server.wait_for_series("DCGM_FI_DEV_GPU_TEMP", 5)

    hosts = hosts_of(gpumon("snapshot", "--json", "--prometheus-url", server.url))
    assert set(hosts) == {"gpu-node (10.0.0.1:9400)", "gpu-node (10.0.0.2:9400)", "node-c"}

    def cards(name: str) -> list[tuple]:
        return [(g["index"], g["uuid"], g["temperature"], g["memory_used"] // MIB)
                for g in hosts[name]["snapshot"]["gpus"]]

    assert cards("gpu-node (10.0.0.1:9400)") == [(0, A0, 41, 100), (1, A1, 42, 200)]
    assert cards("gpu-node (10.0.0.2:9400)") == [(0, B0, 51, 300)]
    assert cards("node-c") == [(0, C0, 61, 400)]

    # One of the two stops: it goes stale under its own name; the other keeps its name.
    asyncio.run(_one_of_two_stops(server, static))


async def _one_of_two_stops(server: Prometheus, static: StaticServer) -> None:
    source = PrometheusSource(server.url, interval=0.5, timeout=3)
    fleet = Fleet([], [source], 0.5)
    heard: dict[str, HostStatus] = {}
    fleet.subscribe(lambda status: heard.__setitem__(status.host, status))
    runner = asyncio.create_task(fleet.run())
    a, b = "gpu-node (10.0.0.1:9400)", "gpu-node (10.0.0.2:9400)"

    async def until(check, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {fleet.statuses()}"
            await asyncio.sleep(0.1)

    try:
        await until(lambda: {heard.get(n, HostStatus(n)).state for n in (a, b)} == {"live"}, "both live")
        static.page("/b", "gone\n", status=404)
        await until(lambda: heard[b].state == "stale", f"{b} stale")
        assert "its exporter is down (10.0.0.2:9400 (job dcgm))" in heard[b].error
        await asyncio.sleep(2)  # a few more refreshes: no host of the bare name appears
        assert heard[a].state == "live" and set(fleet.names) == {a, b, "node-c"}
        assert [g.uuid for g in heard[a].snapshot.gpus] == [A0, A1]
    finally:
        fleet.stop()
        await runner


# -- DCGM's blank values, and dcgm-exporter 2.x's bare labels --

# dcgm_structs.h: DCGM_INT32_BLANK 0x7ffffff0, DCGM_INT64_BLANK 0x7ffffffffffffff0, DCGM_FP64_BLANK
# 2**47; +1 not found, +2 not supported, +3 not permissioned. dcgm-exporter prints them as they are
# (its README: DCGM_FI_DEV_MEMORY_TEMP{...} 9223372036854775794).
INT32_BLANK, INT64_BLANK = 0x7FFFFFF0, 0x7FFFFFFFFFFFFFF0


def test_dcgm_blank_values_are_no_reading(tmp_path, started):
    prometheus = require_tool("prometheus")
    static = StaticServer()
    started.append(static)
    blank = card(1, "GPU-dddddddd-0000-4000-8000-000000000001", "node-d",
                 GPU_TEMP=str(INT64_BLANK + 2), MEMORY_TEMP=str(INT64_BLANK + 2), FAN_SPEED=str(INT64_BLANK),
                 POWER_USAGE="140737488355328.000000", POWER_MGMT_LIMIT="140737488355330.000000",
                 SM_CLOCK=str(INT32_BLANK + 2), MEM_CLOCK=str(INT32_BLANK + 3), GPU_UTIL=str(INT32_BLANK),
                 MEM_COPY_UTIL=str(INT64_BLANK + 1), PCIE_TX_THROUGHPUT=str(INT32_BLANK + 1),
                 ECC_DBE_VOL_TOTAL=str(INT64_BLANK + 3), FB_USED="1024", FB_FREE=str(INT64_BLANK + 1))
    real = card(0, "GPU-dddddddd-0000-4000-8000-000000000000", "node-d", GPU_TEMP="64", MEMORY_TEMP="70",
                FAN_SPEED="35", POWER_USAGE="250.125000", POWER_MGMT_LIMIT="400.000000", SM_CLOCK="1410",
                MEM_CLOCK="1593", GPU_UTIL="93", MEM_COPY_UTIL="40", PCIE_TX_THROUGHPUT="2048",
                ECC_DBE_VOL_TOTAL="0", FB_USED="4096", FB_FREE="77824")
    static.page("/d", exposition(real, blank))
    # dcgm-exporter 2.0's series carry only gpu and UUID (its README's example, spaces included).
    uuid = "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"
    static.page("/old", "".join(f'# HELP {m} {METRICS[m][0]}\n# TYPE {m} gauge\n{m}{{gpu="0", UUID="{uuid}"}} {v}\n'
                                for m, v in [("DCGM_FI_DEV_SM_CLOCK", "139"), ("DCGM_FI_DEV_GPU_TEMP", "40"),
                                             ("DCGM_FI_DEV_FB_FREE", "15079"), ("DCGM_FI_DEV_FB_USED", "0")]))
    server = Prometheus(prometheus, tmp_path, [{"job_name": "dcgm", "static_configs": [
        target(static, "/d", "10.0.0.4:9400"), target(static, "/old", "old-node:9400")]}])
    started.append(server.start())
    server.wait_for_series("DCGM_FI_DEV_GPU_TEMP", 3)

    hosts = hosts_of(gpumon("snapshot", "--json", "--prometheus-url", server.url))
    assert set(hosts) == {"node-d", "old-node:9400"}
    ok, none = hosts["node-d"]["snapshot"]["gpus"]
    assert (ok["temperature"], ok["fan"], ok["power_draw"], ok["power_limit"], ok["clock_sm"], ok["clock_mem"],
            ok["utilization_gpu"], ok["utilization_memory"], ok["pcie_tx"], ok["ecc_errors_uncorrected"],
            ok["memory_used"], ok["memory_free"], ok["memory_total"]) == (
        64, 35, 250.125, 400.0, 1410, 1593, 93, 40, 2048 * 1024, 0, 4096 * MIB, 77824 * MIB, 81920 * MIB)
    readings = ("temperature", "fan", "power_draw", "power_limit", "clock_sm", "clock_mem", "utilization_gpu",
                "utilization_memory", "pcie_tx", "ecc_errors_uncorrected", "memory_free", "memory_total")
    assert {k: none[k] for k in readings} == dict.fromkeys(readings)
    assert none["memory_used"] == 1024 * MIB and none["state"] == "ok"
    (old,) = hosts["old-node:9400"]["snapshot"]["gpus"]
    assert (old["index"], old["uuid"], old["name"], old["pci_bus_id"]) == (0, uuid, "?", None)
    assert (old["temperature"], old["clock_sm"], old["memory_total"]) == (40, 139, 15079 * MIB)

    text = gpumon("snapshot", "--prometheus-url", server.url)
    assert text.returncode == 0, text.stderr
    assert "92233720" not in text.stdout and "140737488" not in text.stdout and "2147483" not in text.stdout
    # No alert fires on a blank: it is no reading at all.
    watched = gpumon("watch", "--prometheus-url", server.url, "--interval", "0.5", "--count", "3",
                     "--alert", "temp > 85", "--alert", "power > 500", "--alert", "fan > 90")
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout == ""


# -- credentials --

def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """gpumon's environment with a HOME of the test's own (its ~/.netrc) and no password unless given."""
    env = {k: v for k, v in os.environ.items() if k not in ("GPUMON_PROMETHEUS_PASSWORD", "GPUMON_CONFIG", "NETRC")}
    home.mkdir(exist_ok=True)
    return env | {"HOME": str(home)} | extra


@pytest.fixture
def guarded(tmp_path, started) -> Prometheus:
    """A real Prometheus that demands basic auth (USER, PASSWORD), scraping one dcgm-exporter."""
    prometheus = require_tool("prometheus")
    static = StaticServer()
    started.append(static)
    static.page("/metrics", exposition(card(0, A0, "node-a", GPU_TEMP="55", FB_USED="10", FB_FREE="90")))
    server = Prometheus(prometheus, tmp_path, [{"job_name": "dcgm", "static_configs": [
        target(static, "/metrics", "10.0.0.1:9400")]}], users={USER: PASSWORD_HASH}, auth=(USER, PASSWORD))
    started.append(server.start())
    server.wait_for_series("DCGM_FI_DEV_GPU_TEMP", 1)
    with pytest.raises(urllib.error.HTTPError, match="401"):  # it does demand a login
        urllib.request.urlopen(f"{server.url}/api/v1/query?query=up", timeout=10)
    return server


def without_secrets(out: subprocess.CompletedProcess[str], *secrets: str) -> subprocess.CompletedProcess[str]:
    for secret in secrets:
        assert secret not in out.stdout and secret not in out.stderr, (secret, out.stdout, out.stderr)
    return out


def test_basic_auth_with_the_password_from_the_environment_a_file_or_netrc(guarded, tmp_path):
    port = guarded.port
    plain = f"http://127.0.0.1:{port}"
    home = tmp_path / "home"
    env = clean_env(home)

    assert_one_line_error(gpumon("snapshot", "--prometheus-url", plain, env=env), 2, "HTTP 401: not allowed")
    # The user in the URL, the password in the environment (never on the command line).
    with_user = f"http://{USER}@127.0.0.1:{port}"
    assert set(hosts_of(gpumon("snapshot", "--json", "--prometheus-url", with_user,
                               env=clean_env(home, GPUMON_PROMETHEUS_PASSWORD=PASSWORD)))) == {"node-a"}
    wrong = gpumon("snapshot", "--prometheus-url", with_user, env=clean_env(home, GPUMON_PROMETHEUS_PASSWORD="nope-42"))
    assert_one_line_error(without_secrets(wrong, "nope-42"), 2, "HTTP 401: not allowed")
    # The user and a password file in the config (relative to the config's folder).
    config = tmp_path / "gpumon.toml"
    (tmp_path / "prometheus-password").write_text(PASSWORD + "\n")
    config.write_text(f'[fleet]\nprometheus_user = "{USER}"\nprometheus_password_file = "prometheus-password"\n')
    assert set(hosts_of(gpumon("snapshot", "--json", "--prometheus-url", plain,
                               env=clean_env(home, GPUMON_CONFIG=str(config))))) == {"node-a"}
    config.write_text(f'[fleet]\nprometheus_user = "{USER}"\nprometheus_password_file = "missing"\n')
    assert_one_line_error(gpumon("snapshot", "--prometheus-url", plain, env=clean_env(home, GPUMON_CONFIG=str(config))),
                          2, "prometheus_password_file")
    # A password with no user to go with it says so.
    assert_one_line_error(gpumon("snapshot", "--prometheus-url", plain,
                                 env=clean_env(home, GPUMON_PROMETHEUS_PASSWORD=PASSWORD)), 2, "no user")
    # ~/.netrc, as curl reads it: the machine is the host name.
    netrc = home / ".netrc"
    netrc.write_text(f"machine 127.0.0.1\n  login {USER}\n  password {PASSWORD}\n")
    netrc.chmod(0o600)
    assert set(hosts_of(gpumon("snapshot", "--json", "--prometheus-url", plain, env=env))) == {"node-a"}
    netrc.chmod(0o644)  # readable by others: refused, as curl's library and Python's netrc do
    assert_one_line_error(without_secrets(gpumon("snapshot", "--prometheus-url", plain, env=env), PASSWORD), 2,
                          ".netrc")
    netrc.unlink()


def test_the_password_is_never_shown(guarded, tmp_path):
    env = clean_env(tmp_path / "home")
    debug = env | {"GPUMON_LOG": "debug"}  # every log line too
    url = f"http://{USER}:{PASSWORD}@127.0.0.1:{guarded.port}"
    shown = f"http://127.0.0.1:{guarded.port}"
    out = without_secrets(gpumon("select", "--verbose", "--prometheus-url", url, env=debug), PASSWORD)
    assert out.returncode == 0 and out.stdout.startswith("node-a\t"), out.stderr
    bad_password = f"http://{USER}:wr0ng-pa55@127.0.0.1:{guarded.port}"
    for command in (["snapshot"], ["select", "--verbose"]):
        out = without_secrets(gpumon(*command, "--prometheus-url", bad_password, env=env), "wr0ng-pa55")
        assert_one_line_error(out, 2, f"Prometheus at {shown}: HTTP 401")
        without_secrets(gpumon(*command, "--prometheus-url", bad_password, env=debug), "wr0ng-pa55")
    for bad in (f"http://{USER}:{PASSWORD}@prom:99999", f"ftp://{USER}:{PASSWORD}@prom:9090"):
        out = without_secrets(gpumon("snapshot", "--prometheus-url", bad, env=env), PASSWORD)
        assert_one_line_error(out, 2, "expected the Prometheus server's address")
        assert f"{USER}:***@prom" in out.stderr
    config = tmp_path / "gpumon.toml"
    config.write_text(f'[fleet]\nprometheus_url = "http://{USER}:{PASSWORD}@prom:99999"\n')
    from gpumon.cli.fleet import prometheus_url
    from gpumon.cli.parser import build_parser
    from gpumon.config import load_config
    from gpumon.errors import UsageError

    with pytest.raises(UsageError) as caught:
        prometheus_url(build_parser().parse_args([]), load_config(str(config)), use_config=True)
    assert PASSWORD not in str(caught.value) and "prometheus_url" in str(caught.value)
    # A server that echoes what it was asked, credentials and all, in its error: gpumon does not repeat them.
    echo = StaticServer()
    try:
        echo.page("/p/api/v1/query", json.dumps({"status": "error", "error": f"bad login {USER}:{PASSWORD}"}),
                  status=400, kind="application/json")
        out = gpumon("snapshot", "--prometheus-url", f"http://{USER}:{PASSWORD}@127.0.0.1:{echo.port}/p", env=env)
        assert_one_line_error(without_secrets(out, PASSWORD), 2, "HTTP 400")
    finally:
        echo.close()


class Redirector:
    """A web server on 127.0.0.2 in front of the Prometheus on 127.0.0.1: /other/... redirects there
    (another host), /same/... redirects to its own /proxy/..., which forwards to Prometheus with the
    Authorization it was sent. It notes the Authorization of every request it gets, by path."""

    def __init__(self, upstream: str) -> None:
        self.seen: list[tuple[str, str | None]] = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                first, _, rest = self.path.lstrip("/").partition("/")
                me.seen.append((first, self.headers.get("Authorization")))
                if first in ("other", "same"):
                    where = f"{upstream}/{rest}" if first == "other" else f"{me.url}/proxy/{rest}"
                    self.send_response(307)
                    self.send_header("Location", where)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                ask = urllib.request.Request(f"{upstream}/{rest}")
                if self.headers.get("Authorization"):
                    ask.add_header("Authorization", self.headers["Authorization"])
                try:
                    with urllib.request.urlopen(ask, timeout=10) as answer:
                        status, body = answer.status, answer.read()
                except urllib.error.HTTPError as exc:
                    status, body = exc.code, exc.read()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.2:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_credentials_are_not_sent_to_another_host_on_a_redirect(guarded, tmp_path, started):
    redirector = Redirector(guarded.url)
    started.append(redirector)
    env = clean_env(tmp_path / "home", GPUMON_PROMETHEUS_PASSWORD=PASSWORD)
    login = f"http://{USER}@127.0.0.2:{redirector.port}"

    # To its own host the login follows the redirect (and through the proxy reaches Prometheus).
    assert set(hosts_of(gpumon("snapshot", "--json", "--prometheus-url", login + "/same", env=env))) == {"node-a"}
    assert {first for first, auth in redirector.seen if auth} == {"same", "proxy"}
    # To another host (the Prometheus on 127.0.0.1 itself) it does not: Prometheus says 401.
    redirector.seen.clear()
    out = gpumon("snapshot", "--prometheus-url", login + "/other", env=env)
    assert_one_line_error(out, 2, "HTTP 401: not allowed")
    assert redirector.seen and all(first == "other" and auth for first, auth in redirector.seen)
