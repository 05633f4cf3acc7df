"""A job's life as the user meets it: the per-card watchdog, stopping it safely, the states that
say how it ended, shared (NFS) homes, and `--systemd` keeping the caller's environment."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import GIB, Card
from test_jobs import four_cards, job_json, run_job, wait_for

from gpumon.jobs.launch import systemd_available


def job_dir(job: dict) -> Path:
    return Path(job["log"]).parent


def pid_script(pid_file: Path, seconds: int = 60) -> list[str]:
    return [sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                                  f"time.sleep({seconds})"]


def state_of(fake_driver, state: str) -> dict:
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["state"] == state], what=f"state {state}")
    return job


def test_watchdog_compares_each_card_with_the_per_card_limit(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card("NVIDIA A40", mem_total=48 * GIB), Card("NVIDIA A40", mem_total=48 * GIB)]
    fake_driver.write()
    pid_file = tmp_path / "pid"
    result = run_job(fake_driver, "--gpu", "0,1", "--mem-limit", "8G", "--", *pid_script(pid_file))
    assert result.returncode == 0, result.stderr
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid"))
    # One process on both cards, 5 GiB on each: 10 GiB in all, but within 8 GiB on every card.
    fake_driver.machine.procs = [dict(gpu=0, pid=pid, mem=5 * GIB), dict(gpu=1, pid=pid, mem=5 * GIB)]
    fake_driver.write()
    time.sleep(2.0)  # ten watchdog samples
    (job,) = job_json(fake_driver)
    assert job["state"] == "running", job["reason"]
    assert job["peak_gpu_memory"] == 5 * GIB  # per card, like the limit
    fake_driver.machine.procs[1]["mem"] = 9 * GIB
    fake_driver.write()
    job = state_of(fake_driver, "killed")
    assert job["reason"] == "memory limit exceeded on GPU 1: 9.0 GiB > 8.0 GiB"
    assert job["peak_gpu_memory"] == 9 * GIB


def test_stop_never_signals_a_recycled_supervisor_pid(fake_driver, idle_processes):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--name", "long", "--", "sleep", "60")
    (job,) = job_json(fake_driver)
    record = job_dir(job) / "supervisor.json"
    supervisor = json.loads(record.read_text())
    os.kill(supervisor["pid"], signal.SIGKILL)  # the supervisor dies ...
    wait_for(lambda: not psutil.pid_exists(supervisor["pid"]) or
             psutil.Process(supervisor["pid"]).status() == psutil.STATUS_ZOMBIE, what="supervisor gone")
    bystander = idle_processes()  # ... and its pid now belongs to someone else
    record.write_text(json.dumps({"pid": bystander.pid, "started": supervisor["started"]}))
    result = fake_driver.run("jobs", "--stop", "long")
    assert result.returncode == 0, result.stderr
    time.sleep(0.5)
    assert bystander.poll() is None, "an unrelated process was signalled"
    wait_for(lambda: not psutil.pid_exists(job["pid"]) or
             psutil.Process(job["pid"]).status() == psutil.STATUS_ZOMBIE, what="the job's command to stop")
    job = state_of(fake_driver, "killed")
    assert "stopped by the user" in job["reason"]


def test_stop_a_queued_job_is_cancelled(fake_driver):
    four_cards(fake_driver.machine)
    for card in fake_driver.machine.cards:
        card.extra["mem_used"] = 47 * GIB
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--wait", "--min-free", "10G", "--", "true")
    (job,) = job_json(fake_driver)
    assert job["state"] == "queued"
    assert fake_driver.run("jobs", "--stop", job["id"]).returncode == 0
    job = state_of(fake_driver, "cancelled")
    assert job["pid"] is None and job["exit_code"] is None and job["signal"] is None
    assert "cancelled" in fake_driver.run("jobs").stdout


def test_a_command_that_cannot_start_has_failed_with_the_reason(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    result = run_job(fake_driver, "--gpu", "0", "--", "/nonexistent/train")
    assert result.returncode == 1 and "could not start" in result.stdout
    (job,) = job_json(fake_driver)
    assert job["state"] == "failed" and job["exit_code"] is None and job["signal"] is None
    assert job["reason"] == "could not start '/nonexistent/train': No such file or directory"
    assert "failed" in fake_driver.run("jobs").stdout


def test_a_job_ended_by_a_signal_names_it(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.write()
    pid_file = tmp_path / "pid"
    run_job(fake_driver, "--gpu", "0", "--name", "victim", "--", *pid_script(pid_file))
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid"))
    os.kill(pid, signal.SIGKILL)  # the kernel's OOM killer, or a colleague
    job = state_of(fake_driver, "killed")
    assert job["signal"] == "SIGKILL" and job["exit_code"] is None
    row = next(line for line in fake_driver.run("jobs").stdout.splitlines() if "victim" in line)
    assert "SIGKILL" in row.split()


def test_the_command_inherits_no_ignored_signal_from_its_supervisor(fake_driver, tmp_path):
    """The supervisor shrugs off SIGHUP; the command must still get the default (a daemon that
    reloads on SIGHUP, a foreground job whose terminal closes)."""
    four_cards(fake_driver.machine)
    fake_driver.write()
    out = tmp_path / "ignored"
    script = ("import signal, sys; open(sys.argv[1], 'w').write(' '.join(s.name for s in signal.Signals "
              "if signal.getsignal(s) is signal.SIG_IGN))")
    run_job(fake_driver, "--gpu", "0", "--", sys.executable, "-c", script, str(out))
    wait_for(lambda: out.exists(), what="the job's report")
    state_of(fake_driver, "exited")
    assert "SIGHUP" not in out.read_text().split() and "SIGINT" not in out.read_text().split()


def test_jobs_json_has_the_contract_keys_and_the_host(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--", "true")
    job = state_of(fake_driver, "exited")
    assert set(job) == {"id", "name", "command", "gpus", "gpu_indices", "host", "state", "pid", "exit_code",
                        "signal", "started", "ended", "log", "mem_limit", "peak_gpu_memory", "reason",
                        "failover", "attempts", "energy_j", "energy_shared", "runs_on", "mem_limits", "supervised"}
    assert job["mem_limits"] == {} and job["supervised"] is None, "no limit; finished: nobody watches it"
    assert job["host"] == socket.gethostname() and job["signal"] is None
    assert job["runs_on"] is None, "it runs on the host that lists it"
    (attempt,) = job["attempts"]  # every job that started has its attempt; --failover jobs may have more
    assert set(attempt) == {"attempt", "gpus", "gpu_indices", "pid", "started", "ended", "exit_code", "signal",
                            "moved_because"}
    assert (attempt["attempt"], attempt["gpu_indices"], attempt["pid"], attempt["exit_code"]) == (1, [0], job["pid"], 0)
    assert job["failover"] == 0 and attempt["ended"] >= attempt["started"]


def test_another_hosts_jobs_on_a_shared_home(fake_driver, idle_processes):
    """An NFS home: job records of gpu07 are here too, with pids that mean nothing on this host."""
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--name", "remote", "--", "sleep", "60")
    run_job(fake_driver, "--gpu", "1", "--name", "local-done", "--", "true")
    remote, _ = job_json(fake_driver)
    directory = job_dir(remote)
    supervisor = json.loads((directory / "supervisor.json").read_text())
    os.kill(supervisor["pid"], signal.SIGKILL)
    os.kill(remote["pid"], signal.SIGKILL)
    bystander = idle_processes()  # on this host, the recorded pid is someone else's
    (directory / "process.json").write_text(json.dumps({"pid": bystander.pid, "started": remote["started"]}))
    (directory / "supervisor.json").write_text(json.dumps({"pid": bystander.pid, "started": supervisor["started"]}))
    spec = json.loads((directory / "job.json").read_text())
    (directory / "job.json").write_text(json.dumps(spec | {"host": "gpu07"}))
    wait_for(lambda: [j for j in job_json(fake_driver) if j["name"] == "local-done" and j["state"] == "exited"],
             what="the local job to end")

    remote = next(j for j in job_json(fake_driver) if j["name"] == "remote")
    assert remote["state"] == "running" and remote["host"] == "gpu07"
    row = next(line for line in fake_driver.run("jobs").stdout.splitlines() if "remote" in line)
    assert "on gpu07" in row and "lost" not in row
    stop = fake_driver.run("jobs", "--stop", "remote")
    assert stop.returncode == 2 and "gpu07" in stop.stderr and "Traceback" not in stop.stderr
    assert bystander.poll() is None
    pruned = fake_driver.run("jobs", "--prune")
    assert pruned.returncode == 0
    assert "local-done" in pruned.stdout and "remote" not in pruned.stdout  # it says what it removes
    assert [j["name"] for j in job_json(fake_driver)] == ["remote"]


ENV_PROBE = ("import json, os, sys; json.dump({k: os.environ.get(k) for k in "
             "('PATH', 'LD_LIBRARY_PATH', 'CUDA_HOME', 'CUDA_VISIBLE_DEVICES')}, open(sys.argv[1], 'w'))")


def callers_environment(fake_driver, tmp_path: Path) -> dict[str, str]:
    venv_bin = tmp_path / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    return fake_driver.env | {"PATH": f"{venv_bin}:{os.environ['PATH']}", "LD_LIBRARY_PATH": "/opt/cuda/lib64",
                              "CUDA_HOME": "/opt/cuda-12.4"}


def assert_environment_kept(fake_driver, tmp_path: Path, env: dict[str, str]) -> None:
    probe = tmp_path / "probe.json"
    result = subprocess.run([sys.executable, "-m", "gpumon", "run", "--interval", "0.2", "--gpu", "0", "--systemd",
                             "--", sys.executable, "-c", ENV_PROBE, str(probe)], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    wait_for(lambda: probe.exists() and probe.stat().st_size > 0, what="the job's probe")
    seen = json.loads(probe.read_text())
    assert seen["PATH"] == env["PATH"]
    assert (seen["LD_LIBRARY_PATH"], seen["CUDA_HOME"]) == ("/opt/cuda/lib64", "/opt/cuda-12.4")
    assert seen["CUDA_VISIBLE_DEVICES"] == fake_driver.machine.cards[0].uuid


def test_systemd_job_keeps_the_callers_environment(fake_driver, tmp_path):
    if not systemd_available():
        pytest.skip("no systemd user instance is reachable here (systemctl --user show-environment fails)")
    four_cards(fake_driver.machine)
    fake_driver.write()
    assert_environment_kept(fake_driver, tmp_path, callers_environment(fake_driver, tmp_path))


FAKE_SYSTEMD_RUN = """#!/bin/sh
# Starts the unit's command the way a user manager does: detached, in the manager's own minimal
# environment, not the caller's.
while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done
exec setsid env -i HOME="$HOME" PATH=/usr/bin:/bin "$@" </dev/null >/dev/null 2>&1 &
"""


def test_systemd_job_keeps_the_callers_environment_under_a_minimal_manager(fake_driver, tmp_path):
    """Where no systemd user instance is reachable: a stand-in `systemd-run` that, like the real
    user manager, starts the unit with an environment of its own."""
    four_cards(fake_driver.machine)
    fake_driver.write()
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, text in (("systemd-run", FAKE_SYSTEMD_RUN), ("systemctl", "#!/bin/sh\nexit 0\n")):
        (tools / name).write_text(text)
        (tools / name).chmod(stat.S_IRWXU)
    env = callers_environment(fake_driver, tmp_path)
    env["PATH"] = f"{tools}:{env['PATH']}"
    assert_environment_kept(fake_driver, tmp_path, env)
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["state"] == "exited"], what="exit")
    assert not any(job_dir(job).glob("environment*")), "the saved environment is removed once read"


def test_snapshot_checks_its_config_file(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    bad = tmp_path / "bad.toml"
    bad.write_text("interval = [\n")
    result = fake_driver.run("snapshot", "--config", str(bad))
    assert result.returncode == 2 and str(bad) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr



def test_a_failing_systemd_run_is_one_line_and_a_failed_job(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.write()
    tools = tmp_path / "tools"
    tools.mkdir()
    for name, text in (("systemd-run", "#!/bin/sh\necho 'Failed to start transient service unit: Access denied' >&2\n"
                                       "exit 1\n"), ("systemctl", "#!/bin/sh\nexit 0\n")):
        (tools / name).write_text(text)
        (tools / name).chmod(stat.S_IRWXU)
    env = fake_driver.env | {"PATH": f"{tools}:{os.environ['PATH']}"}
    result = subprocess.run([sys.executable, "-m", "gpumon", "run", "--gpu", "0", "--systemd", "--", "true"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Access denied" in result.stderr and "Traceback" not in result.stderr
    (job,) = job_json(fake_driver)
    assert job["state"] == "failed" and "Access denied" in job["reason"]
    assert not any(job_dir(job).glob("environment*"))


def test_a_stepped_clock_does_not_lose_a_running_job(fake_driver):
    """The date a process started moves when the clock is stepped (psutil adds the boot time,
    which moves with it); the job is still recognised by its start since boot, and can be stopped."""
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--name", "steady", "--", "sleep", "60")
    (job,) = job_json(fake_driver)
    for name in ("process.json", "supervisor.json"):
        record = job_dir(job) / name
        data = json.loads(record.read_text())
        assert data["booted"] > 0
        data["started"] += 2.0  # as if recorded before the clock was stepped back by 2 s
        record.write_text(json.dumps(data))
    assert job_json(fake_driver)[0]["state"] == "running"
    assert fake_driver.run("jobs", "--stop", "steady").returncode == 0
    job = state_of(fake_driver, "killed")
    assert "stopped by the user" in job["reason"]


def test_a_recycled_pid_is_not_the_job_even_with_a_boot_relative_record(fake_driver, idle_processes):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--name", "gone", "--", "sleep", "60")
    (job,) = job_json(fake_driver)
    record = job_dir(job) / "supervisor.json"
    supervisor = json.loads(record.read_text())
    os.kill(supervisor["pid"], signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(supervisor["pid"]) or
             psutil.Process(supervisor["pid"]).status() == psutil.STATUS_ZOMBIE, what="supervisor gone")
    bystander = idle_processes()
    record.write_text(json.dumps({**supervisor, "pid": bystander.pid}))
    assert fake_driver.run("jobs", "--stop", "gone").returncode == 0
    time.sleep(0.5)
    assert bystander.poll() is None, "an unrelated process was signalled"
