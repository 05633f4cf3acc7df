"""One scenario against this machine and against a fleet host over a real sshd: every action a view
takes on a host (launch, list, follow, stop, signal, topology) goes through jobs/host.py, and the two
kinds of host answer alike."""

from __future__ import annotations

import json
import time

import psutil
import pytest
from conftest import Card

from gpumon.fleet import open_fleet
from gpumon.fleet.schema import jobs_from_remote
from gpumon.jobs.host import HostError, LocalHost, host_at, host_for
from gpumon.jobs.launch import LaunchRequest
from gpumon.remote.hosts import parse_hosts
from gpumon.remote.ssh import SshTransport

JOB_FIELDS = {"host", "id", "name", "state", "gpus", "gpu_indices", "pid", "exit_code", "started", "ended",
              "command", "log", "reason"}


@pytest.fixture(params=["local", "ssh"])
def host(request, fake_driver, ssh_lab, monkeypatch):
    """The same two-card machine, as `local` (this gpumon as a child) or as `h` over ssh."""
    cards, nvlinks = [Card(), Card()], [(0, 1, 4)]
    if request.param == "local":
        fake_driver.machine.cards, fake_driver.machine.nvlinks = cards, nvlinks
        fake_driver.write()
        return LocalHost(["--nvml-lib", str(fake_driver.lib)])
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(ssh_lab.runtime_dir))
    lab_host = ssh_lab.host("h")
    lab_host.machine.cards, lab_host.machine.nvlinks = cards, nvlinks
    lab_host.write()
    (spec,) = parse_hosts("h")
    return host_at(spec, SshTransport(ssh_lab.ssh, ssh_lab.remote_gpumon))


def wait_for(check, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return result


def test_a_job_and_a_process_on_a_host_local_or_remote(host, idle_processes):
    topo = host.topology()
    assert topo.indices == (0, 1) and topo.links[0][0] == "X" and topo.links[0][1] == "NV4"

    said = host.launch(LaunchRequest(["sh", "-c", "echo started; while :; do echo tick; sleep 0.2; done"],
                                     "1", name="ticker"))
    assert said.startswith("job ") and "GPU 1" in said
    (job,) = [j for j in host.jobs() if j["name"] == "ticker"]
    assert JOB_FIELDS <= set(job)
    assert (job["host"], job["state"], job["gpu_indices"]) == (host.name, "running", [1])
    assert job["id"] == said.split()[1]

    follower = host.follow_log(job["id"])
    assert follower.stdout.readline() == b"started\n"
    assert follower.stdout.readline() == b"tick\n"
    assert host.stop(job["id"]).startswith("stopping job")
    follower.stdout.read()  # the log's follower ends by itself once the job has
    assert follower.wait(30) == 0
    ended = wait_for(lambda: [j for j in host.jobs() if j["id"] == job["id"] and j["state"] != "running"],
                     "the job to end")[0]
    assert (ended["state"], ended["reason"], ended["pid"]) == ("killed", "stopped by the user", job["pid"])
    assert ended["ended"] is not None

    victim = idle_processes()
    started = psutil.Process(victim.pid).create_time()
    with pytest.raises(HostError, match=rf"^{host.name}: .*different process"):
        host.signal(victim.pid, started - 100, "terminate")
    assert victim.poll() is None
    assert host.signal(victim.pid, started, "terminate") == f"sent SIGTERM to {victim.pid}"
    assert victim.wait(10) == -15
    with pytest.raises(HostError, match=rf"^{host.name}: .*already exited"):
        host.signal(victim.pid, started, "kill")


def test_a_fleet_host_only_read_from_afar_cannot_be_acted_on():
    fleet = open_fleet(parse_hosts("local"), None, 1.0, open_local=lambda: None)
    assert isinstance(host_for(fleet, "local"), LocalHost)
    with pytest.raises(HostError, match="^elsewhere: not in the fleet"):
        host_for(fleet, "elsewhere")


def test_this_machine_lists_its_jobs_in_process_as_its_gpumon_jobs_json_does(fake_driver, tmp_path):
    """LocalHost.jobs() reads the records here, without a child gpumon (J lists every second), and
    answers what the child's `gpumon jobs --json` answers, field for field."""
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    local = LocalHost(["--nvml-lib", str(fake_driver.lib)])
    said = local.launch(LaunchRequest(["sh", "-c", "exit 3"], "0", name="three", failover=2))
    wait_for(lambda: [j for j in local.jobs() if j["state"] == "exited"], "the job to end")
    child = json.loads(local.call(["jobs", "--json"]))
    assert child[0]["id"] == said.split()[1] and child[0]["runs_on"] is None
    for job in child:
        job["host"] = "local"  # as every host names its jobs
    assert local.jobs() == jobs_from_remote(child)
    assert local.jobs()[0]["exit_code"] == 3 and local.jobs()[0]["failover"] == 2
    # No child: one started with an unreadable config would fail (every command checks it).
    unstartable = LocalHost(["--config", str(tmp_path / "missing.toml")])
    with pytest.raises(HostError, match="missing.toml"):
        unstartable.call(["jobs", "--json"])
    assert unstartable.jobs() == local.jobs()
