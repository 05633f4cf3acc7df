"""Prometheus output checked by the real Prometheus tools (Debian's `prometheus` package)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import GIB, Card, require_tool
from promlab import exposition

from gpumon.alerting.prometheus_rules import prometheus_rules
from gpumon.alerting.rules import parse_rules
from gpumon.cards.backends.demo import DemoBackend
from gpumon.errors import UsageError
from gpumon.exporter.collector import GpumonCollector, parse_listen_address

# dcgm-exporter's label names are camelCase (modelName, UUID, Hostname), and one of its metric names
# says its type (the PCIe replay counter); compatibility wins over promtool's naming lint, whose
# findings about these are the only ones allowed.
ALLOWED_LINT = ("label names should be written in 'snake_case' not 'camelCase'",
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter'")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def check_metrics(text: bytes) -> None:
    promtool = require_tool("promtool")
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    problems = [line for line in out.stderr.decode().splitlines() + out.stdout.decode().splitlines() if line.strip()]
    assert out.returncode in (0, 3), problems
    assert all(any(allowed in p for allowed in ALLOWED_LINT) for p in problems), problems


def test_exposition_parses_with_promtool():
    backend = DemoBackend("lost")
    for _ in range(20):
        latest = backend.sample()
    text = exposition(GpumonCollector(lambda: latest, processes=True))
    check_metrics(text)
    body = text.decode()
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
                 "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
                 "gpumon_gpu_lost", "gpumon_process_gpu_memory_bytes"):
        assert f"\n{name}{{" in body or body.startswith(f"{name}{{"), name
    assert 'gpumon_gpu_lost{Hostname=' in body
    assert 'gpu="2",hpc_job="",modelName="NVIDIA A100-SXM4-80GB",namespace="",pci_bus_id' in body
    # The lost card exports no stale readings, only its lost flag.
    assert 'DCGM_FI_DEV_GPU_TEMP{Hostname="%s",UUID="%s"' % (latest.host, latest.gpus[2].uuid) not in body


def test_framebuffer_in_mib_like_dcgm_exporter():
    latest = DemoBackend().sample()
    body = exposition(GpumonCollector(lambda: latest)).decode()
    used = latest.gpus[0].memory_used / (1 << 20)
    assert (f'gpu="0",hpc_job="4242",modelName="NVIDIA A100-SXM4-80GB",namespace="",pci_bus_id="00000000:07:00.0",'
            f'pod="",vendor="nvidia"}} {used}') in body  # the demo's card 0 is Slurm job 4242's


RULES = ["temp > 85 for 30s", "throttle thermal on 0,1", "power > 90%", "mem >= 95% for 1m", "lost", "xid",
         "util < 5 for 10m on 0,1", "ecc > 0", "mem_used > 8G", "procs > 3", "fan > 90 clear 80"]


def test_exported_rules_load_in_promtool(tmp_path):
    promtool = require_tool("promtool")
    rules = tmp_path / "rules.yml"
    rules.write_text(prometheus_rules(parse_rules(RULES)))
    out = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(RULES)} rules found" in out.stdout


def test_exported_rules_behave_in_promtool_test(tmp_path):
    promtool = require_tool("promtool")
    (tmp_path / "rules.yml").write_text(prometheus_rules(parse_rules(["temp > 85 for 30s", "throttle thermal"])))
    labels = ('gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H100",Hostname="node1",'
              'pci_bus_id="00000000:17:00.0"')
    exp_labels = {"severity": "warning", "gpu": "0", "UUID": "GPU-1", "device": "nvidia0", "modelName": "NVIDIA H100",
                  "Hostname": "node1", "pci_bus_id": "00000000:17:00.0"}
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": [
                # 70 °C, then 90 °C from 30 s on: pending at 30 s, firing once it held 30 s.
                {"series": f"DCGM_FI_DEV_GPU_TEMP{{{labels}}}", "values": "70 70 90 90 90 90 90 90"},
                # sw_thermal (0x20) set from 15 s, plus sw_power_cap (0x4).
                {"series": f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{labels}}}", "values": "4 36 36 36 36 36 36 36"},
            ],
            "alert_rule_test": [
                {"eval_time": "15s", "alertname": "GpumonTemp1", "exp_alerts": []},
                {"eval_time": "45s", "alertname": "GpumonTemp1", "exp_alerts": []},
                {"eval_time": "75s", "alertname": "GpumonTemp1", "exp_alerts": [{
                    "exp_labels": exp_labels,
                    "exp_annotations": {"summary": "gpumon rule 'temp > 85 for 30s' on GPU 0 (NVIDIA H100)",
                                        "rule": "temp > 85 for 30s"}}]},
                {"eval_time": "0s", "alertname": "GpumonThrottle2", "exp_alerts": []},
                {"eval_time": "30s", "alertname": "GpumonThrottle2", "exp_alerts": [{
                    "exp_labels": exp_labels,
                    "exp_annotations": {"summary": "gpumon rule 'throttle thermal' on GPU 0 (NVIDIA H100)",
                                        "rule": "throttle thermal"}}]},
            ],
        }],
    }
    (tmp_path / "test.yml").write_text(json.dumps(test))  # JSON is YAML
    out = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_alerts_export_command(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpumon", "alerts", "export", "--prometheus-rules",
                          "--alert", "temp > 85 for 30s"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "for: 30s" in out.stdout and "DCGM_FI_DEV_GPU_TEMP > 85" in out.stdout


def test_listen_address_defaults_to_loopback():
    assert parse_listen_address("9400") == ("127.0.0.1", 9400)
    assert parse_listen_address(":9400") == ("127.0.0.1", 9400)
    assert parse_listen_address("0.0.0.0:9400") == ("0.0.0.0", 9400)
    for bad in ("x", "1:2:x", "70000", "0"):
        with pytest.raises(UsageError):
            parse_listen_address(bad)


def test_real_prometheus_scrapes_gpumon_watch(fake_driver, tmp_path):
    prometheus = require_tool("prometheus")
    fake_driver.machine.cards = [Card("NVIDIA L4", mem_total=24 * GIB, extra=dict(temp=67, util=12)),
                                 Card("NVIDIA L4", mem_total=24 * GIB, extra=dict(temp=41))]
    fake_driver.write()
    port, prom_port = free_port(), free_port()
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "watch", "--interval", "0.5", "--alert", "temp > 60",
                              "--prometheus", str(port)], env=fake_driver.env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "gpumon", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}],
    }))
    server = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        result = []
        while time.monotonic() < deadline:
            try:
                answer = json.loads(fetch(f"http://127.0.0.1:{prom_port}/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP"))
                result = answer["data"]["result"]
            except (OSError, ValueError, KeyError):
                result = []
            if len(result) == 2:
                break
            time.sleep(0.5)
        assert len(result) == 2, "Prometheus never scraped gpumon"
        temps = {r["metric"]["gpu"]: float(r["value"][1]) for r in result}
        assert temps == {"0": 67.0, "1": 41.0}
        assert {r["metric"]["modelName"] for r in result} == {"NVIDIA L4"}
        firing = json.loads(fetch(f"http://127.0.0.1:{prom_port}/api/v1/query?query=gpumon_alert_firing"))
        assert [r["metric"]["gpu"] for r in firing["data"]["result"]] == ["0"]
        check_metrics(fetch(f"http://127.0.0.1:{port}/metrics"))
    finally:
        server.terminate()
        watch.terminate()
        server.wait(20)
        assert watch.wait(20) == 0


def test_port_in_use_is_a_usage_error(fake_driver):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        out = fake_driver.run("watch", "--prometheus", str(busy.getsockname()[1]), "--count", "1")
    assert out.returncode == 2 and "cannot serve Prometheus metrics" in out.stderr


def test_the_exported_mem_rule_means_what_gpumons_own_mem_rule_does(tmp_path):
    """gpumon's mem is used / total; in dcgm-exporter's terms the total is used + free + reserved
    (FB_RESERVED, where the exporter has it). The exported rule, evaluated by promtool, fires on
    exactly the cards where gpumon's own rule fires on the same values as gpumon reads them."""
    from gpumon.alerting.rules import AlertEngine
    from gpumon.fleet.prometheus.dcgm import read_cluster

    promtool = require_tool("promtool")
    rules = parse_rules(["mem > 86", "mem >= 75%", "mem < 50"])
    (tmp_path / "rules.yml").write_text(prometheus_rules(rules))
    # MiB used, free, reserved (None: dcgm-exporter 3.x has no FB_RESERVED). Used / (used + free)
    # would put cards 0, 2 and 3 on the other side of a threshold.
    cards = {0: (70000, 11000, 559), 1: (61440, 19715, None), 2: (60000, 19000, 1500), 3: (40000, 39000, 2000)}

    def labels(gpu: int) -> dict[str, str]:
        return {"gpu": str(gpu), "UUID": f"GPU-{gpu}", "device": f"nvidia{gpu}", "modelName": "NVIDIA H100",
                "Hostname": "node1", "pci_bus_id": f"00000000:{gpu + 17:02X}:00.0"}

    readings = [({**labels(gpu), "__name__": f"DCGM_FI_DEV_FB_{name}"}, float(mib))
                for gpu, values in cards.items() for name, mib in zip(("USED", "FREE", "RESERVED"), values, strict=True)
                if mib is not None]
    cluster = read_cluster(0.0, [(labels(gpu), 0.0) for gpu in cards], readings, [], [])
    engine = AlertEngine(rules)
    engine.evaluate(cluster.hosts["node1"].snapshot())
    gpumon_fires = engine.firing()  # card -> rule texts
    assert gpumon_fires == {0: ("mem >= 75%",), 1: ("mem >= 75%",), 3: ("mem < 50",)}

    def expected(i: int, rule) -> dict:
        firing = [gpu for gpu in cards if rule.text in gpumon_fires.get(gpu, ())]
        return {"eval_time": "15s", "alertname": f"GpumonMem{i + 1}", "exp_alerts": [
            {"exp_labels": {**labels(gpu), "severity": "warning"},
             "exp_annotations": {"summary": f"gpumon rule {rule.text!r} on GPU {gpu} (NVIDIA H100)", "rule": rule.text}}
            for gpu in firing]}

    test = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": "{__name__=\"%s\",%s}" % (lab["__name__"], ",".join(
            f'{k}="{v}"' for k, v in lab.items() if k != "__name__")), "values": f"{value:g}x4"}
            for lab, value in readings],
        "alert_rule_test": [expected(i, rule) for i, rule in enumerate(rules)],
    }]}
    (tmp_path / "test.yml").write_text(json.dumps(test))
    out = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
