"""`gpumon watch` when its outputs break, XID alerts (gpumon's and the exported Prometheus rule),
and the exporter's scrape thread reading rule states while the event loop changes them."""

from __future__ import annotations

import json
import subprocess
import threading
import time

from conftest import Card, require_tool
from test_watch import events_of, start_watch

from gpumon.alerting.prometheus_rules import prometheus_rules
from gpumon.alerting.rules import AlertEngine, parse_rule, parse_rules
from gpumon.exporter.collector import GpumonCollector
from gpumon.model import GpuSample, Snapshot


def test_a_closed_stdout_ends_watch_quietly_with_status_0(fake_driver):
    """`gpumon watch --metrics | head -1`."""
    fake_driver.machine.cards = [Card(extra=dict(temp=60))]
    fake_driver.write()
    proc = start_watch(fake_driver, "--metrics", "--format", "jsonl", "--interval", "0.2")
    assert json.loads(proc.stdout.readline())["event"] == "sample"
    proc.stdout.close()  # the reader has gone
    try:
        status = proc.wait(timeout=20)
    finally:
        proc.kill()
    stderr = proc.stderr.read()
    assert status == 0 and stderr == "", stderr


def test_a_failing_recording_is_reported_once_and_alerting_goes_on(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(extra=dict(temp=60)), Card(extra=dict(temp=70))]
    fake_driver.write()
    marker = tmp_path / "hook-ran"
    # /dev/full: every write fails with ENOSPC, like a full disk.
    proc = start_watch(fake_driver, "--record", "/dev/full", "--metrics", "--alert", "temp > 80", "--interval", "0.2",
                       "--count", "30", "--on-alert", f"touch {marker}", "--exit-on-alert")
    for _ in range(3):
        assert json.loads(proc.stdout.readline())["event"] == "sample"  # sampling goes on
    fake_driver.machine.cards[1].extra["temp"] = 91
    fake_driver.write()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1, "--exit-on-alert still exits"
    firing = [e for e in events_of(out) if e["event"] == "firing"]
    assert [(e["gpu"], e["value"]) for e in firing] == [(1, 91)]
    assert marker.exists(), "the hook still ran"
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "/dev/full" in lines[0] and "No space left" in lines[0], err
    assert "Traceback" not in err


def test_each_xid_fires_once_with_its_code_and_stays_until_a_quiet_period(fake_driver):
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.xids = [dict(gpu=1, at=0.8, code=79), dict(gpu=1, at=1.6, code=48)]
    fake_driver.write()
    out = fake_driver.run("watch", "--alert", "xid", "--interval", "0.4", "--count", "12")
    events = events_of(out.stdout)
    assert [(e["event"], e["gpu"], e["value"]) for e in events] == [("firing", 1, 79), ("firing", 1, 48)]
    # The default quiet period is 10 minutes: a 5-second watch never sees it resolve.


def test_xid_for_sets_the_quiet_period(fake_driver):
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.xids = [dict(gpu=0, at=0.5, code=13)]
    fake_driver.write()
    out = fake_driver.run("watch", "--alert", "xid for 2s", "--interval", "0.4", "--count", "14")
    events = events_of(out.stdout)
    assert [(e["event"], e["gpu"]) for e in events] == [("firing", 0), ("resolved", 0)]
    assert events[0]["value"] == 13
    assert 2.0 <= events[1]["time"] - events[0]["time"] < 3.5


def test_xid_rule_parses_with_a_default_quiet_period():
    assert parse_rule("xid").duration == 600
    assert parse_rule("xid == 79").duration == 600
    assert parse_rule("xid for 30m").duration == 1800


def test_the_exported_xid_rule_fires_on_an_xid_and_resolves_after_the_quiet_period(tmp_path):
    promtool = require_tool("promtool")
    (tmp_path / "rules.yml").write_text(prometheus_rules(parse_rules(["xid", "xid == 79 for 2m"])))
    labels = 'gpu="1",UUID="GPU-1",device="nvidia1",modelName="NVIDIA H100",Hostname="node1",pci_bus_id="0:17:00.0"'
    card = {"gpu": "1", "UUID": "GPU-1", "device": "nvidia1", "modelName": "NVIDIA H100", "Hostname": "node1",
            "pci_bus_id": "0:17:00.0"}
    # The exporter's per card and XID code: unix time of the newest such XID. XID 79 at t=60 s.
    series = f'gpumon_xid_last_timestamp_seconds{{{labels},xid="79"}}'

    def alerts(name: str, at: str, firing: bool) -> dict:
        rule = {"GpumonXid1": "xid", "GpumonXid2": "xid == 79 for 2m"}[name]
        notes = {"rule": rule, "summary": f"gpumon rule {rule!r} on GPU 1 (NVIDIA H100): XID 79"}
        expected = [{"exp_labels": card | {"xid": "79", "severity": "warning"}, "exp_annotations": notes}]
        return {"eval_time": at, "alertname": name, "exp_alerts": expected if firing else []}

    test = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [{"series": series, "values": "_ _ _ _ 60+0x80"}],
        "alert_rule_test": [
            alerts("GpumonXid1", "45s", False), alerts("GpumonXid1", "75s", True),  # fires at once
            alerts("GpumonXid1", "9m", True),                                     # quiet for < 10 min
            alerts("GpumonXid1", "11m", False),                                   # resolved after it
            alerts("GpumonXid2", "75s", True), alerts("GpumonXid2", "2m30s", True),
            alerts("GpumonXid2", "3m30s", False),
        ],
    }]}
    (tmp_path / "test.yml").write_text(json.dumps(test))
    out = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def snap(t: float, gpus: tuple[GpuSample, ...]) -> Snapshot:
    return Snapshot(time=t, host="h", backend="nvml", driver_version=None, cuda_driver_version=None, gpus=gpus)


def test_scrapes_read_a_consistent_copy_of_the_rule_states():
    """The exporter's thread reads the rule states while the event loop adds and changes them."""
    rules = parse_rules([f"temp > {t}" for t in range(0, 60, 2)])
    engine = AlertEngine(rules)
    first = snap(0.0, (GpuSample(index=0, uuid="GPU-0", name="A", pci_bus_id="0", temperature=90),))
    collector = GpumonCollector(lambda: first, engine.firing)
    errors: list[BaseException] = []
    done = threading.Event()

    def evaluate() -> None:
        try:
            for step in range(150):  # cards come and go (a flaky riser, MIG reconfiguration): new states
                gpus = tuple(GpuSample(index=step * 8 + i, uuid=f"GPU-{i}", name="A", pci_bus_id="0",
                                       temperature=step % 90) for i in range(8))
                engine.evaluate(snap(float(step), gpus))
        finally:
            done.set()

    def scrape() -> None:
        while not done.is_set():
            try:
                for _ in collector.collect():
                    pass
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
                return

    threads = [threading.Thread(target=evaluate), threading.Thread(target=scrape)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert engine.firing(), "the scrape sees the states the loop published"


def test_hooks_get_xid_events_with_the_code(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.xids = [dict(gpu=1, at=0.6, code=79), dict(gpu=1, at=1.2, code=79)]
    fake_driver.write()
    log = tmp_path / "hooks"
    out = fake_driver.run("watch", "--alert", "xid == 79", "--interval", "0.4", "--count", "8",
                          "--on-alert", f'echo "$GPUMON_EVENT $GPUMON_VALUE" >> {log}')
    assert out.returncode == 0, out.stderr
    time.sleep(0.2)
    assert log.read_text().splitlines() == ["firing 79", "firing 79"]


def test_exported_xid_code_comparisons_match_exactly_the_codes_gpumon_would():
    import re

    from gpumon.alerting.prometheus_rules import rule_expr

    for text in ("xid > 100", "xid < 50", "xid >= 13", "xid <= 9", "xid != 79", "xid == 79", "xid"):
        rule = parse_rule(text)
        expr = rule_expr(rule)
        matcher = re.search(r'xid(=~|!=|=)"([^"]*)"', expr)
        for code in range(1, 1000):
            if matcher is None:
                selected = True
            elif matcher.group(1) == "=~":
                selected = re.fullmatch(matcher.group(2), str(code)) is not None
            else:
                selected = (str(code) == matcher.group(2)) == (matcher.group(1) == "=")
            assert selected == rule.holds(float(code)), (text, code, expr)
