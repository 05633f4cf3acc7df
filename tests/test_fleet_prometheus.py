"""A cluster read through a real Prometheus on loopback (`--prometheus-url`): `gpumon watch
--prometheus` exporters on fake machines of their own, and dcgm-exporter expositions (its label
variants: Hostname / hostname / none, exported_* renames, MIG, a frozen exporter) served by a
small static HTTP server. Prometheus, the exporters and the static server are real processes or
sockets; nothing of gpumon's is mocked."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GIB, Card, FakeDriver, require_tool
from promlab import RECORDED, Exporter, Prometheus, StaticServer, free_port, scrape_job
from test_cli import assert_one_line_error

from gpumon.fleet import Fleet, PrometheusSource
from gpumon.jobs.host import HostError, host_for
from gpumon.model import HostStatus

MIB = 1 << 20
NOTE = "read through Prometheus: no way to reach the node"
# What dcgm-exporter's names carry of the schema (no pstate, NUMA or CPU affinity).
THROUGH_PROMETHEUS = ("uuid", "name", "pci_bus_id", "state", "utilization_gpu", "utilization_memory", "memory_total",
                      "memory_used", "memory_free", "temperature", "fan", "power_draw", "power_limit", "clock_sm",
                      "clock_mem", "throttle_reasons", "ecc_errors_uncorrected", "pcie_tx", "pcie_rx",
                      "encoder_util", "decoder_util")


def gpumon(*args: str, env: dict[str, str] | None = None, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumon", *args], capture_output=True, text=True, timeout=timeout,
                          env=env)


@pytest.fixture
def started():
    """Everything a test starts, ended afterwards by pid (exporters, Prometheus, static servers)."""
    things: list = []
    yield things
    for thing in reversed(things):
        (thing.close if isinstance(thing, StaticServer) else thing.stop)()


def by_host(doc: dict) -> dict[str, dict]:
    return {h["host"]: h for h in doc["hosts"]}


# -- dcgm-exporter's label variants, from expositions written in its format --

def frozen(text: str, age_s: float) -> callable:
    """The exposition with every sample stamped `age_s` in the past (an exporter that froze; with
    explicit timestamps Prometheus keeps serving the last samples and marks nothing stale)."""
    stamp = int((time.time() - age_s) * 1000)
    body = "\n".join(line if line.startswith("#") or not line else f"{line} {stamp}" for line in text.splitlines())
    return lambda: (body + "\n").encode()


def test_dcgm_exporter_expositions_with_every_label_variant(tmp_path, started):
    prometheus = require_tool("prometheus")
    static = StaticServer()
    started.append(static)
    k8s = (RECORDED / "dcgm-exporter-3.3-kubernetes.prom").read_text()
    mig = (RECORDED / "dcgm-exporter-4-mig.prom").read_text()
    old = (RECORDED / "dcgm-exporter-2-no-host.prom").read_text()
    static.page("/a", k8s)
    static.page("/b", mig)
    static.page("/c", old)
    static.page("/d", frozen(old, 120))
    static.page("/e", mig)
    target = f"127.0.0.1:{static.port}"

    def job(path: str, instance: str, **labels: str) -> dict:
        return {"targets": [target], "labels": {"__metrics_path__": path, "instance": instance, **labels}}

    server = Prometheus(prometheus, tmp_path, [{"job_name": "dcgm", "static_configs": [
        # A ServiceMonitor's target labels: the exporter's own pod. Prometheus renames dcgm-exporter's
        # pod/namespace/container (the card's owner) to exported_*.
        job("/a", "10.0.0.1:9400", pod="nvidia-dcgm-exporter-5xk2p", namespace="gpu-operator",
            container="nvidia-dcgm-exporter"),
        job("/b", "10.0.0.2:9400"),
        job("/c", "node-c:9400"),
        job("/d", "node-d:9400"),
        # A target label `hostname` set by the operator: the exporter's becomes exported_hostname.
        job("/e", "10.0.0.5:9400", hostname="node-e"),
    ]}])
    started.append(server.start())
    server.wait_for_series("DCGM_FI_DEV_GPU_TEMP", 2 + 3 + 1 + 1 + 3)

    out = gpumon("snapshot", "--json", "--prometheus-url", server.url)
    assert out.returncode == 0, out.stderr
    hosts = by_host(json.loads(out.stdout))
    assert set(hosts) == {"node-a", "node-b", "node-c:9400", "node-d:9400", "node-e"}
    assert {h["source"] for h in hosts.values()} == {"prometheus"}
    assert {n: h["state"] for n, h in hosts.items()} == {
        "node-a": "ok", "node-b": "ok", "node-c:9400": "ok", "node-d:9400": "stale", "node-e": "ok"}
    assert "no new data in Prometheus" in hosts["node-d:9400"]["error"]

    a = hosts["node-a"]["snapshot"]
    assert (a["backend"], a["driver_version"], a["host"]) == ("prometheus", "535.129.03", "node-a")
    card0, card1 = a["gpus"]
    assert card0 | {"processes": None} == card0 | {
        "index": 0, "uuid": "GPU-1f027ee8-6e1e-2b8c-0108-3d370e5f0418", "name": "NVIDIA A100-SXM4-80GB",
        "pci_bus_id": "00000000:07:00.0", "state": "ok", "utilization_gpu": 87, "utilization_memory": 41,
        "memory_used": 61440 * MIB, "memory_free": 19715 * MIB, "memory_total": (61440 + 19715) * MIB,
        "temperature": 71, "power_draw": 312.457, "clock_sm": 1410, "clock_mem": 1593, "encoder_util": 0,
        "fan": None, "pstate": None, "numa_node": None, "processes": None,
        "owner": "ml-team/train-llama-7f9c6d-x2x4q (pytorch)"}
    # Idle: its plain pod label is the exporter's own (the scrape target's), so nobody holds it.
    assert card1["owner"] is None and card1["memory_used"] == 0 and card1["utilization_gpu"] == 0

    for name in ("node-b", "node-e"):  # `hostname`, and a target's `hostname` over the exporter's
        h100, sliced = hosts[name]["snapshot"]["gpus"]
        assert h100["throttle_reasons"] == ["sw_power_cap", "sw_thermal"]
        assert h100["memory_total"] == (70000 + 11000 + 559) * MIB  # used + free + reserved
        assert (h100["utilization_gpu"], h100["temperature"], h100["owner"]) == (99, 83, None)
        # MIG: two 3g.40gb slices make the card; one is held by a notebook pod.
        assert (sliced["index"], sliced["memory_used"], sliced["memory_free"]) == (1, 20000 * MIB, 60448 * MIB)
        assert sliced["memory_total"] == 80448 * MIB and sliced["utilization_gpu"] is None
        assert sliced["owner"] == "research/notebook-0 (jupyter)" and sliced["temperature"] == 45
    (t4,) = hosts["node-c:9400"]["snapshot"]["gpus"]
    assert (t4["name"], t4["memory_total"], t4["pci_bus_id"]) == ("Tesla T4", (250 + 14910) * MIB, None)

    text = gpumon("snapshot", "--prometheus-url", server.url)
    assert text.returncode == 0 and f"== node-a: live (prometheus)  [{NOTE}]" in text.stdout
    assert "NVIDIA A100-SXM4-80GB" in text.stdout

    best = gpumon("select", "--prometheus-url", server.url)
    assert best.returncode == 0, best.stderr
    assert best.stdout == "node-a\tGPU-4e75c9ab-0ed7-8a57-75f5-23761b9f053f\n"  # the most free memory


# -- gpumon's own exporters, on three different fake machines --

def machines(fake_lib: Path, tmp_path: Path, pid: int) -> list[FakeDriver]:
    a = FakeDriver(fake_lib, tmp_path / "a.conf")
    a.machine.cards = [
        Card("NVIDIA L4", uuid="GPU-aaaaaaaa-0000-0000-0000-000000000000", bus="00000000:01:00.0", mem_total=24 * GIB,
             extra=dict(temp=67, util=12, mem_util=5, power_mw=30000, power_limit_mw=72000, clock_sm=1800,
                        clock_mem=6251, fan=40, mem_used=5 * GIB, mem_reserved=512 * MIB)),
        Card("NVIDIA L4", uuid="GPU-aaaaaaaa-0000-0000-0000-000000000001", bus="00000000:02:00.0", mem_total=24 * GIB,
             extra=dict(temp=41, util=80, power_mw=71500, power_limit_mw=72000, clock_sm=2040, mem_used=GIB)),
    ]
    b = FakeDriver(fake_lib, tmp_path / "b.conf")
    b.machine.cards = [
        Card("NVIDIA H100 80GB HBM3", uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", mem_total=80 * GIB,
             extra=dict(temp=55, util=99, power_mw=650000, power_limit_mw=700000, mem_used=70 * GIB)),
        Card("NVIDIA H100 80GB HBM3", uuid="GPU-bbbbbbbb-0000-0000-0000-000000000001", mem_total=80 * GIB,
             extra=dict(lost_after=3)),
    ]
    c = FakeDriver(fake_lib, tmp_path / "c.conf")
    c.machine.cards = [Card("NVIDIA A100-SXM4-40GB", uuid="GPU-cccccccc-0000-0000-0000-000000000000",
                            extra=dict(temp=38, util=0))]
    c.machine.procs = [dict(gpu=0, pid=pid, mem=2 * GIB)]
    for driver in (a, b, c):
        driver.write()
    return [a, b, c]


def expected(driver: FakeDriver) -> dict:
    out = driver.run("snapshot", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_gpumon_exporters_are_hosts_with_their_values_then_stale_then_unreachable(fake_lib, tmp_path, started,
                                                                                   idle_processes):
    prometheus = require_tool("prometheus")
    job = idle_processes()
    drivers = machines(fake_lib, tmp_path, job.pid)
    names = ["gpu-a", "gpu-b", "gpu-c"]
    exporters = [Exporter(d.env, name, processes=True) for d, name in zip(drivers, names, strict=True)]
    for exporter in exporters:
        started.append(exporter.start())
    server = Prometheus(prometheus, tmp_path, [scrape_job("gpumon", [e.target for e in exporters])])
    started.append(server.start())
    time.sleep(3.5)  # gpu-b's second card is lost by now
    server.wait_for_series("gpumon_gpu_lost == 1", 1)
    server.wait_for_series("DCGM_FI_DEV_GPU_TEMP", 4)

    out = gpumon("snapshot", "--json", "--prometheus-url", server.url)
    assert out.returncode == 0, out.stderr
    hosts = by_host(json.loads(out.stdout))
    assert list(hosts) == sorted(hosts) and set(hosts) == set(names)  # two exporters on one machine: two hosts
    for name, driver in zip(names, drivers, strict=True):
        local = expected(driver)
        read = hosts[name]["snapshot"]
        assert hosts[name]["state"] == "ok" and read["backend"] == "prometheus" and read["host"] == name
        assert len(read["gpus"]) == len(local["gpus"])
        for mine, theirs in zip(read["gpus"], local["gpus"], strict=True):
            if (name, mine["index"]) == ("gpu-b", 1):  # lost 3 s after the exporter began: only that it is lost
                assert (mine["state"], mine["uuid"], mine["temperature"]) == ("lost", theirs["uuid"], None)
                continue
            assert {k: mine[k] for k in THROUGH_PROMETHEUS} == {k: theirs[k] for k in THROUGH_PROMETHEUS}
    (proc,) = hosts["gpu-c"]["snapshot"]["gpus"][0]["processes"]
    assert (proc["pid"], proc["gpu_memory"], proc["user"]) == (job.pid, 2 * GIB, expected(drivers[2])["gpus"][0][
        "processes"][0]["user"])
    assert proc["command"] == Path(sys.executable).name

    watched = gpumon("watch", "--prometheus-url", server.url, "--interval", "0.5", "--count", "6",
                     "--alert", "temp > 60")
    assert watched.returncode == 0, watched.stderr
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [(e["event"], e["host"], e["gpu"], e["value"]) for e in events] == [("firing", "gpu-a", 0, 67)]

    asyncio.run(_live_then_stale_then_unreachable(server, exporters, names))


async def _live_then_stale_then_unreachable(server: Prometheus, exporters: list[Exporter], names: list[str]) -> None:
    source = PrometheusSource(server.url, interval=0.5, timeout=3)
    fleet = Fleet([], [source], 0.5)
    heard: dict[str, HostStatus] = {}
    fleet.subscribe(lambda status: heard.__setitem__(status.host, status))
    runner = asyncio.create_task(fleet.run())

    async def until(check, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {fleet.statuses()}"
            await asyncio.sleep(0.1)

    try:
        await until(lambda: {heard.get(n, HostStatus(n)).state for n in names} == {"live"}, "every host live")
        assert set(fleet.names) == set(names) and not fleet.problems()
        assert all(not s.can_launch and s.launch_refusal == NOTE for s in fleet.statuses())
        with pytest.raises(HostError, match="no way to reach the node"):
            host_for(fleet, "gpu-a")

        exporters[1].stop()  # gpu-b's exporter ends: Prometheus drops its series at the next scrape
        await until(lambda: heard["gpu-b"].state == "stale", "gpu-b stale")
        assert f"its exporter is down ({exporters[1].target} (job gpumon))" in heard["gpu-b"].error
        assert heard["gpu-b"].snapshot is not None  # the last reading stays
        assert heard["gpu-a"].state == heard["gpu-c"].state == "live"

        server.stop()  # Prometheus itself goes away
        await until(lambda: {s.state for s in fleet.statuses()} == {"unreachable"}, "every host unreachable")
        assert all("connection refused" in s.error for s in fleet.statuses())
        assert fleet.problems() == (f"Prometheus at {server.url}: connection refused",)
    finally:
        fleet.stop()
        await runner


# -- a host listed for ssh and also known to Prometheus: the listed reading wins, once --

def test_a_listed_host_is_not_read_twice(fake_driver, tmp_path, started):
    prometheus = require_tool("prometheus")
    fake_driver.machine.cards = [Card("NVIDIA L4", extra=dict(temp=50))]
    fake_driver.write()
    here, there = Exporter(fake_driver.env, "local").start(), Exporter(fake_driver.env, "elsewhere").start()
    started += [here, there]
    server = Prometheus(prometheus, tmp_path, [scrape_job("gpumon", [here.target, there.target])]).start()
    started.append(server)
    server.wait_for_series("DCGM_FI_DEV_GPU_TEMP", 2)
    out = fake_driver.run("snapshot", "--json", "--hosts", "local", "--prometheus-url", server.url)
    assert out.returncode == 0, out.stderr
    assert [(h["host"], h["source"]) for h in json.loads(out.stdout)["hosts"]] == [("local", "local"),
                                                                                  ("elsewhere", "prometheus")]


# -- what cannot be read: one line and status 2 for a command; the reason in the fleet --

def test_bad_urls_and_servers_that_are_not_prometheus(tmp_path, started):
    for url, words in [("ftp://prom:9090", "expected the Prometheus server's address"),
                       ("http://", "expected the Prometheus server's address"),
                       ("http://prom:99999", "expected the Prometheus server's address"),
                       ("http://prom:9090/?x=1", "expected the Prometheus server's address")]:
        assert_one_line_error(gpumon("snapshot", "--prometheus-url", url), 2, words)
    static = StaticServer()
    started.append(static)
    static.page("/html/api/v1/query", "<html>Grafana login</html>", kind="text/html")
    static.page("/json/api/v1/query", '{"hello": "world"}', kind="application/json")
    static.page("/down/api/v1/query", '{"status":"error","errorType":"unavailable","error":"TSDB not ready"}',
                status=503, kind="application/json")
    static.page("/empty/api/v1/query", '{"status":"success","data":{"resultType":"vector","result":[]}}',
                kind="application/json")
    cases = [
        (static.url + "/html", "answered with something that is not JSON"),
        (static.url + "/json", "JSON that is not Prometheus' API"),
        (static.url + "/down", "HTTP 503: TSDB not ready"),
        (static.url + "/nothing", "HTTP 404: no Prometheus API here"),
        (static.url + "/empty", "no GPU series"),
        (f"http://127.0.0.1:{_closed_port()}", "connection refused"),
        ("http://no-such-host.invalid:9090", "name not resolved"),
    ]
    for url, words in cases:
        for command in ("snapshot", "select"):
            assert_one_line_error(gpumon(command, "--prometheus-url", url), 2, words)
    assert_one_line_error(gpumon("run", "--prometheus-url", static.url, "--host", "node-a", "--", "true"), 2,
                          "cannot launch on node-a through Prometheus")
    assert_one_line_error(gpumon("jobs", "--prometheus-url", static.url), 2, "cannot list")
    assert_one_line_error(gpumon("watch", "--demo", "--prometheus", "0", "--prometheus-hostname", "gpu\x1b[31m"), 2,
                          "bad --prometheus-hostname")


def _closed_port() -> int:
    return free_port()  # nothing listens there once its probe socket is closed


def test_watch_keeps_running_and_says_why_prometheus_cannot_be_read():
    port = _closed_port()
    out = gpumon("watch", "--prometheus-url", f"http://127.0.0.1:{port}", "--interval", "0.2", "--count", "5")
    assert out.returncode == 5, out.stderr  # it went on to its count, and could read no host
    assert out.stderr.count(f"Prometheus at http://127.0.0.1:{port}: connection refused") == 1


def test_a_server_that_never_answers_is_a_timeout(started):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # accepts connections, never answers
    try:
        source = PrometheusSource(f"http://127.0.0.1:{listener.getsockname()[1]}", interval=0.2, timeout=0.5)
        fleet = Fleet([], [source], 0.2)

        async def once() -> None:
            runner = asyncio.create_task(fleet.run())
            await fleet.settle(5)
            fleet.stop()
            await runner

        started_at = time.monotonic()
        asyncio.run(once())
        assert time.monotonic() - started_at < 5
        assert fleet.problems() == (f"{source.label}: timeout (no answer in 0.5 s)",)
    finally:
        listener.close()


def test_config_names_the_cluster_for_the_tui_only(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[fleet]\nprometheus_url = "not a url"\n')
    from gpumon.cli.fleet import prometheus_url
    from gpumon.cli.parser import build_parser
    from gpumon.config import load_config
    from gpumon.errors import UsageError

    loaded = load_config(str(config))
    args = build_parser().parse_args([])
    assert prometheus_url(args, loaded) is None  # headless commands: only the command line
    with pytest.raises(UsageError, match=r"\[fleet\] prometheus_url: bad --prometheus-url 'not a url'"):
        prometheus_url(args, loaded, use_config=True)
    config.write_text('[fleet]\nprometheus_url = "http://prom:9090/"\n')
    assert prometheus_url(args, load_config(str(config)), use_config=True) == "http://prom:9090"
    assert os.environ.get("GPUMON_CONFIG") is None
