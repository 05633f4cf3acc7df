"""The headless fleet behaves like the headless host, over a real sshd (tests/sshd.py): `watch
--hosts` into a closed pipe, the fleet's own Prometheus exporter, topology asked of every candidate
host at once, and `--local` beside a config that lists hosts."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
from conftest import Card, require_tool
from prometheus_client.parser import text_string_to_metric_families
from promlab import Prometheus, StaticServer, exposition, scrape_job
from test_prometheus import check_metrics, free_port

from gpumon.cards.backends.demo import DemoBackend
from gpumon.exporter.collector import FleetCollector, Reading


def _until(condition, timeout: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _ssh_children(pid: int) -> list[psutil.Process]:
    """The ssh clients gpumon runs (not a shared connection's master, which outlives them by design)."""
    found = []
    for proc in psutil.Process(pid).children(recursive=True):
        try:
            cmdline = proc.cmdline()
        except psutil.Error:
            continue
        if cmdline[:1] == ["ssh"]:
            found.append(proc)
    return found


def test_watch_hosts_into_a_pipe_that_closes_ends_quietly_with_its_ssh_children(ssh_lab, tmp_path):
    for name in ("a", "b"):
        ssh_lab.host(name).machine.cards = [Card()]
        ssh_lab.hosts[name].write()
    errors = tmp_path / "stderr"
    with open(errors, "w") as stderr:
        watch = subprocess.Popen(ssh_lab.gpumon_argv("watch", "--hosts", "a,b", "--metrics", "--interval", "0.3"),
                                 env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=stderr)
    try:
        children = _until(lambda: len(_ssh_children(watch.pid)) >= 2 and _ssh_children(watch.pid),
                          what="an ssh client per host")
        # `watch --hosts … | head -1`: head reads one line and goes; the next line finds no reader.
        head = subprocess.Popen(["head", "-1"], stdin=watch.stdout, stdout=subprocess.PIPE, text=True)
        watch.stdout.close()
        first, _ = head.communicate(timeout=60)
        assert json.loads(first)["event"] == "sample"
        assert watch.wait(30) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(10)
    text = errors.read_text()
    assert "Traceback" not in text and "BrokenPipe" not in text, text
    assert not psutil.wait_procs(children, timeout=15)[1], "ssh clients left running"
    for host in ssh_lab.hosts.values():
        assert _until(lambda: not [p for p in host.server.sessions() if "--stream" in " ".join(p.cmdline())],
                      what="the remote streams to end")


def _scrape(port: int) -> dict[str, list]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body = response.read()
    check_metrics(body)
    return {family.name: family.samples for family in text_string_to_metric_families(body.decode())}


def _by_host(samples) -> dict[str, list[tuple[str, str, float]]]:
    out: dict[str, list] = {}
    for sample in samples:
        out.setdefault(sample.labels["Hostname"], []).append((sample.labels["gpu"], sample.labels["modelName"],
                                                              sample.value))
    return {host: sorted(cards) for host, cards in out.items()}


def test_watch_hosts_serves_every_hosts_cards_from_one_exporter_as_the_config_asks(ssh_lab, tmp_path):
    big, small = ssh_lab.server(), ssh_lab.server()
    ssh_lab.host("big", server=big).machine.cards = [Card("NVIDIA H100 80GB HBM3", extra=dict(util=71)),
                                                     Card("NVIDIA H100 80GB HBM3", extra=dict(util=72))]
    ssh_lab.host("small", server=small).machine.cards = [Card("NVIDIA A30", extra=dict(util=5, temp=90))]
    for host in ssh_lab.hosts.values():
        host.write()
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f'[watch]\nprometheus = "127.0.0.1:{port}"\nrules = ["temp > 80"]\n'
                      '[fleet.groups]\nlab = ["big", "small"]\n')
    watch = subprocess.Popen(ssh_lab.gpumon_argv("watch", "--hosts", "@lab", "--config", str(config),
                                                 "--interval", "0.3"),
                             env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def both_up():
            try:
                metrics = _scrape(port)
            except OSError:
                return None
            up = {s.labels["Hostname"]: s.value for s in metrics.get("gpumon_host_up", [])}
            return metrics if up == {"big": 1.0, "small": 1.0} and "gpumon_alert_firing" in metrics \
                and metrics["gpumon_alert_firing"] else None

        metrics = _until(both_up, 60, "both hosts up on the exporter")
        assert _by_host(metrics["DCGM_FI_DEV_GPU_UTIL"]) == {
            "big": [("0", "NVIDIA H100 80GB HBM3", 71.0), ("1", "NVIDIA H100 80GB HBM3", 72.0)],
            "small": [("0", "NVIDIA A30", 5.0)]}
        assert {s.labels["Hostname"] for s in metrics["gpumon_sample_age_seconds"]} == {"big", "small"}
        assert [(s.labels["Hostname"], s.labels["gpu"], s.labels["rule"]) for s in metrics["gpumon_alert_firing"]] \
            == [("small", "0", "temp > 80")]

        small.kill()  # the host goes away: it is down, and its old values are no longer a reading

        def small_down():
            metrics = _scrape(port)
            up = {s.labels["Hostname"]: s.value for s in metrics["gpumon_host_up"]}
            return metrics if up == {"big": 1.0, "small": 0.0} else None

        metrics = _until(small_down, 60, "small to be down on the exporter")
        assert set(_by_host(metrics["DCGM_FI_DEV_GPU_UTIL"])) == {"big"}
        watch.terminate()
        assert watch.wait(30) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(10)
    assert "Traceback" not in watch.stderr.read()


def test_watch_hosts_refuses_one_machines_hostname_label(ssh_lab):
    ssh_lab.host("a")
    result = ssh_lab.gpumon("watch", "--hosts", "a", "--prometheus", str(free_port()), "--prometheus-hostname", "x")
    assert result.returncode == 2
    assert result.stderr.startswith("gpumon: error: --prometheus-hostname names one machine")
    assert "Traceback" not in result.stderr


def _slow_topology_gpumon(tmp_path: Path, real: str, delay: float) -> tuple[str, Path]:
    """A remote gpumon whose `topo` answers only after `delay` seconds, logging when each `topo`
    began and ended; everything else is the real one."""
    log = tmp_path / "topo-times"
    wrapper = tmp_path / "slow-topo-gpumon"
    wrapper.write_text(f"""#!/bin/sh
case " $* " in *" topo "*)
  echo "start $(date +%s.%N)" >> {log}; sleep {delay}; {real} "$@"; rc=$?
  echo "end $(date +%s.%N)" >> {log}; exit $rc;;
esac
exec {real} "$@"
""")
    wrapper.chmod(0o755)
    return str(wrapper), log


def _topology_phase(log: Path) -> tuple[int, float, float]:
    """How many hosts were asked, how far apart the questions began, and how long until the last answer."""
    times: dict[str, list[float]] = {"start": [], "end": []}
    for line in log.read_text().splitlines():
        kind, when = line.split()
        times[kind].append(float(when))
    log.unlink()
    return len(times["start"]), max(times["start"]) - min(times["start"]), max(times["end"]) - min(times["start"])


def test_select_and_run_ask_every_candidate_host_for_its_topology_at_once(ssh_lab, tmp_path):
    names = ["t0", "t1", "t2", "t3"]
    for name in names:
        ssh_lab.host(name).machine.cards = [Card(), Card()]
        ssh_lab.hosts[name].write()
    remote, log = _slow_topology_gpumon(tmp_path, ssh_lab.remote_gpumon, 2)
    result = ssh_lab.gpumon("select", "--hosts", ",".join(names), "--count", "2", remote=remote)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\t")[0] in names
    # One after another: the questions 2 s apart at least, and 4 x 2 s until the last answer.
    asked, spread, took = _topology_phase(log)
    assert asked == 4 and spread < 2.0 and took < 6.0, (asked, spread, took)
    launched = ssh_lab.gpumon("run", "--hosts", ",".join(names), "--gpu", "auto:2", "--", "true", remote=remote)
    assert launched.returncode == 0, launched.stderr
    asked, spread, took = _topology_phase(log)
    assert asked == 4 and spread < 2.0 and took < 6.0, (asked, spread, took)


def test_local_opens_this_machine_alone_beside_a_config_that_lists_hosts(fake_driver, tmux_session, tmp_path):
    fake_driver.machine.cards = [Card("NVIDIA L40S")]
    fake_driver.write()
    config = tmp_path / "config.toml"
    config.write_text('[fleet]\nhosts = ["nowhere.invalid"]\n')
    for argv in (["--local", "snapshot", "--json"], ["snapshot", "--local", "--json"]):
        result = fake_driver.run("--config", str(config), *argv)
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert "hosts" not in doc and [g["name"] for g in doc["gpus"]] == ["NVIDIA L40S"]
    both = fake_driver.run("--config", str(config), "snapshot", "--local", "--hosts", "gpu01")
    assert both.returncode == 2
    assert both.stderr == "gpumon: error: --local reads this machine alone: not with --hosts, --hostfile or " \
                          "--prometheus-url\n"

    keep = ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "TZ", "XDG_CONFIG_HOME", "XDG_STATE_HOME")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items() if k in keep)
    # The local view's header can be drawn a frame before its card rows: wait for the rows too.
    for options, shows in (("", ("1 host",)), ("--local", ("driver 550.54.15", "NVIDIA L40S"))):
        status = tmp_path / f"status{options}"
        tmux = tmux_session(120, 30)
        tmux.start(f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --config {config} "
                   f"{options} --interval 0.5; echo $? > {status}")
        screen = tmux.wait_for(lambda s, shows=shows: all(text in s for text in shows), timeout=30,
                               what=f"gpumon {options}")
        assert ("NVIDIA L40S" in screen) == (options == "--local")  # the fleet is the configured host alone
        tmux.keys("q")
        _until(lambda status=status: status.exists() and status.read_text().strip() == "0", 20, "gpumon to quit")
        tmux.kill()


def test_a_fleet_exporters_hosts_keep_their_own_sample_age_through_prometheus(tmp_path):
    """Read back through a real Prometheus, each host of one fleet exporter (one scrape target) is
    judged by its own gpumon_sample_age_seconds: the host whose readings stopped is stale, not another."""
    prometheus = require_tool("prometheus")
    fresh = DemoBackend().sample()
    frozen = dataclasses.replace(fresh, time=fresh.time - 600)  # its host stopped answering 10 min ago

    def readings():
        now = dataclasses.replace(fresh, time=time.time())
        hosts = [Reading("a-fresh", now), Reading("b-frozen", frozen), Reading("c-fresh", now)]
        return hosts, {r.host: True for r in hosts}

    static = StaticServer()
    static.page("/metrics", lambda: exposition(FleetCollector(readings)))
    server = Prometheus(prometheus, tmp_path, [scrape_job("fleet", [f"127.0.0.1:{static.port}"])])
    try:
        server.start()
        server.wait_for_series("gpumon_sample_age_seconds", 3)
        out = subprocess.run([sys.executable, "-m", "gpumon", "snapshot", "--json", "--prometheus-url", server.url],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        hosts = {h["host"]: h for h in json.loads(out.stdout)["hosts"]}
        assert {name: h["state"] for name, h in hosts.items()} == {"a-fresh": "ok", "b-frozen": "stale",
                                                                    "c-fresh": "ok"}
        assert "its gpumon has had no new reading" in hosts["b-frozen"]["error"]
    finally:
        server.stop()
        static.close()
