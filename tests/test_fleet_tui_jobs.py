"""Jobs from the TUI in a real terminal (tmux): the run dialog's Failover on a fleet host (over a
real sshd, tests/sshd.py) reaches that host's gpumon, whose job list keeps `failover` and
`attempts` for `jobs --hosts --json` and the fleet's `J`; and `--readonly` refuses `s` in `J`,
on one machine and in the fleet, saying why."""

from __future__ import annotations

import json
import shlex
import sys

from conftest import GIB, Card
from test_fleet_tui_ssh import quit_tui, start_tui, type_text
from test_jobs import job_json, run_job, wait_for

UUIDS = [f"GPU-{i:08d}-fa11-0000-cccc-dddddddddddd" for i in range(2)]


def remote_jobs(ssh_lab, host: str) -> list[dict]:
    listed = ssh_lab.gpumon("jobs", "--hosts", host, "--json")
    assert listed.returncode == 0, listed.stderr
    return json.loads(listed.stdout)


def test_failover_from_the_fleet_run_dialog_is_kept_and_J_shows_the_move(ssh_lab, tmux_session, tmp_path):
    host = ssh_lab.host("h")
    host.machine.cards = [Card("NVIDIA A30", uuid=uuid, mem_total=24 * GIB) for uuid in UUIDS]
    host.machine.scan_env = True  # the fake driver lists a process on the card its CUDA_VISIBLE_DEVICES names
    host.write()
    tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "h")
    tmux.wait_for(lambda s: "1 host: 1 live" in s or "1 hosts: 1 live" in s, timeout=60, what="the host live")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "gpumon h" in s and "NVIDIA A30" in s, timeout=30, what="the host's view")
    tmux.keys("r")
    tmux.wait_for(lambda s: "Run on h:0: NVIDIA A30" in s, what="the run dialog for h:0")
    type_text(tmux, "sleep 300")
    tmux.keys(*["Tab"] * 6, "Space")  # command, directory, limit, NUMA, Foreground, Wait: Failover
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "launched on h:0" in s, timeout=30, what="the launch reported")

    (job,) = remote_jobs(ssh_lab, "h")
    assert (job["state"], job["gpu_indices"], job["failover"]) == ("running", [0], 3)
    assert [(a["attempt"], a["gpu_indices"], a["moved_because"]) for a in job["attempts"]] == [(1, [0], None)]

    host.machine.cards[0].extra["lost_after"] = 0  # card 0 fails: the job moves to card 1
    host.write()
    moved = wait_for(lambda: (j := remote_jobs(ssh_lab, "h")[0])["gpu_indices"] == [1] and j["state"] == "running"
                     and j, timeout=60, what="the job to move to card 1")
    assert [(a["attempt"], a["gpu_indices"], a["moved_because"]) for a in moved["attempts"]] == [
        (1, [0], "GPU 0 is lost"), (2, [1], None)]
    tmux.keys("J")
    tmux.wait_for(lambda s: moved["id"] in s and "attempt 1: GPU 0" in s and "moved: GPU 0 is lost" in s
                  and "attempt 2: GPU 1" in s, timeout=30, what="J with the job's attempts")
    tmux.keys("s")
    tmux.wait_for(lambda s: "on h?" in s, what="stop confirmation")
    tmux.keys("y")
    wait_for(lambda: remote_jobs(ssh_lab, "h")[0]["state"] == "killed", timeout=30, what="the job stopped")
    tmux.keys("Escape", "Escape")
    quit_tui(tmux, status)


def test_readonly_s_in_the_fleets_J_does_not_stop_the_job_and_says_why(ssh_lab, tmux_session, tmp_path):
    ssh_lab.host("h").machine.cards = [Card()]
    ssh_lab.hosts["h"].write()
    launched = ssh_lab.gpumon("run", "--host", "h", "--gpu", "0", "--", "sleep", "300")
    assert launched.returncode == 0, launched.stderr
    (job,) = remote_jobs(ssh_lab, "h")
    tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "h", options=("--readonly",))
    tmux.wait_for(lambda s: "1 live" in s, timeout=60, what="the host live")
    tmux.keys("J")
    tmux.wait_for(lambda s: any(job["id"] in line and "running" in line for line in s.splitlines()), timeout=30,
                  what="the job in J")
    tmux.keys("s")
    tmux.wait_for(lambda s: "read-only (--readonly): jobs are not stopped from here" in s, what="why not")
    assert f"({job['id']}) on h?" not in tmux.screen()  # no confirmation was asked
    (still,) = remote_jobs(ssh_lab, "h")
    assert still["state"] == "running" and still["pid"] == job["pid"]
    tmux.keys("Escape")
    quit_tui(tmux, status)
    ssh_lab.gpumon("jobs", "--hosts", "h", "--stop", job["id"])


def test_readonly_s_in_J_does_not_stop_the_job_and_says_why(fake_driver, tmux_session, tmp_path):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    launched = run_job(fake_driver, "--gpu", "0", "--", "sleep", "300")
    assert launched.returncode == 0, launched.stderr
    (job,) = job_json(fake_driver)
    try:
        keep = ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "TZ", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
                "XDG_DATA_HOME")
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items() if k in keep)
        status = tmp_path / "status"
        tmux = tmux_session(120, 40)
        tmux.start(f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --readonly "
                   f"--interval 0.5; echo $? > {status}")
        tmux.wait_for(lambda s: "A100" in s, timeout=30, what="the card")
        tmux.keys("J")
        tmux.wait_for(lambda s: any(job["id"] in line and "running" in line for line in s.splitlines()),
                      what="the job in J")
        tmux.keys("s")
        tmux.wait_for(lambda s: "read-only (--readonly): jobs are not stopped from here" in s, what="why not")
        assert f"({job['id']})?" not in tmux.screen()  # no confirmation was asked
        (still,) = job_json(fake_driver)
        assert still["state"] == "running" and still["pid"] == job["pid"]
        tmux.keys("Escape")
        quit_tui(tmux, status)
    finally:
        fake_driver.run("jobs", "--stop", job["id"])
