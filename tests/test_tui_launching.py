"""The run dialog launches the same job from the single-machine TUI and from a fleet host's view:
the same answers typed into the dialog (command, memory limit, NUMA off, Failover) give the same job
record on this machine and on a fleet host over a real sshd (tests/sshd.py), field for field. A box
of the dialog that one path drops (as the fleet's once dropped Failover) makes them differ."""

from __future__ import annotations

import re

from conftest import GIB, Card
from test_fleet_tui_ssh import quit_tui, start_tui, type_text
from test_host_interface import wait_for
from test_tui import run, started
from test_tui_host import app_on, wait_until

from gpumon.jobs.host import LocalHost, host_at
from gpumon.remote.hosts import parse_hosts
from gpumon.remote.ssh import SshTransport

CARDS = [Card("NVIDIA A10", uuid=f"GPU-1a0c4e{i}0-0000-1111-2222-333344445555", mem_total=24 * GIB)
         for i in range(2)]
TYPED = "echo ran on $CUDA_VISIBLE_DEVICES; exec sleep 60"
# What the dialog decides: the rest (id, pid, times, the log's path) is each start's own.
DECIDED = ("name", "command", "gpus", "gpu_indices", "mem_limit", "failover", "state")


def decided(job: dict) -> dict:
    return {key: job[key] for key in DECIDED}


def log_of(host, job_id: str) -> bytes:
    """The job's output as its host keeps it, the time of each start left out."""
    reader = host.follow_log(job_id, follow=False)
    # Its stdout, as gpumon reads it (a host's login banner and mark taken off: communicate()
    # would read the pipe underneath).
    out = reader.stdout.read()
    reader.stdin.close()
    reader.wait(30)
    return re.sub(rb"\(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d, ", b"(", out)


def test_the_same_dialog_answers_launch_the_same_job_here_and_on_a_fleet_host(
        fake_driver, ssh_lab, tmux_session, tmp_path, monkeypatch):
    # On this machine: the single-machine TUI.
    backend, app = app_on(fake_driver, CARDS)
    local = LocalHost(["--nvml-lib", str(fake_driver.lib)])

    async def here():
        async with app.run_test(size=(160, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", *TYPED, "tab", "tab", *"8G", "tab", "space", "tab", "tab", "tab", "space", "enter")
            return (await wait_until(pilot, lambda: [j for j in local.jobs() if j["state"] == "running"],
                                     "the job here"))[0]

    try:
        job_here = run(here())
    finally:
        backend.close()

    # On a fleet host: the fleet TUI over ssh, its host's view, the same keys.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(ssh_lab.runtime_dir))
    lab = ssh_lab.host("h")
    lab.machine.cards = list(CARDS)
    lab.write()
    (spec,) = parse_hosts("h")
    there = host_at(spec, SshTransport(ssh_lab.ssh, ssh_lab.remote_gpumon))
    tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "h", size=(160, 40))
    tmux.wait_for(lambda s: "1 live" in s, timeout=60, what="the host live")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "gpumon h" in s and "NVIDIA A10" in s, timeout=30, what="the host's view")
    tmux.keys("r")
    tmux.wait_for(lambda s: "Run on h:0" in s, what="the run dialog for h:0")
    type_text(tmux, TYPED)
    tmux.keys("Tab", "Tab")
    type_text(tmux, "8G")
    tmux.keys("Tab", "Space", "Tab", "Tab", "Tab", "Space", "Enter")
    tmux.wait_for(lambda s: "launched on h:0" in s, timeout=30, what="the launch reported")
    (job_there,) = [j for j in there.jobs() if j["state"] == "running"]
    try:
        assert decided(job_here) == decided(job_there)
        assert (job_here["mem_limit"], job_here["failover"], job_here["gpus"]) == (8 * GIB, 3, [CARDS[0].uuid])
        logs = [wait_for(lambda: log_of(host, job["id"]), f"the log on {host.name}")
                for host, job in ((local, job_here), (there, job_there))]
        assert logs[0] == logs[1]
        assert logs[0].endswith(f"attempt 1 of at most 4 on GPU 0 ({CARDS[0].uuid}) ===\nran on {CARDS[0].uuid}\n"
                                .encode())
    finally:
        local.stop(job_here["id"])
        there.stop(job_there["id"])
    quit_tui(tmux, status)
