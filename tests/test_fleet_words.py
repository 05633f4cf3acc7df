"""Fleet commands over the real sshd (tests/sshd.py) say what they know: a host that could not be
reached is exit status 4/5 whatever the command (`run --host` too), a listing that read nothing
does not say "No jobs.", and a host whose gpumon is not on the PATH points at where to name it."""

from __future__ import annotations

import json

from conftest import Card


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_run_on_an_unreachable_host_is_status_5_like_every_fleet_command(ssh_lab):
    ssh_lab.host("up").machine.cards = [Card()]
    ssh_lab.hosts["up"].write()
    unreachable = ssh_lab.gpumon("run", "--host", "nowhere.invalid", "--gpu", "0", "--", "true")
    assert unreachable.returncode == 5, unreachable.stderr
    assert _one_line(unreachable).startswith("gpumon: error: nowhere.invalid: ")
    # A host that answers and refuses: what was asked is wrong there (exit 2, as here).
    refused = ssh_lab.gpumon("run", "--host", "up", "--gpu", "7", "--", "true")
    assert refused.returncode == 2, refused.stderr
    assert "up: " in _one_line(refused)


def test_jobs_of_hosts_that_could_not_be_read_do_not_say_no_jobs(ssh_lab):
    ssh_lab.host("up").machine.cards = [Card()]
    ssh_lab.hosts["up"].write()
    none = ssh_lab.gpumon("jobs", "--hosts", "nowhere.invalid")
    assert none.returncode == 5
    assert "No jobs" not in none.stdout
    assert none.stdout.strip() == "No host could be read: their jobs are unknown."
    some = ssh_lab.gpumon("jobs", "--hosts", "up,nowhere.invalid")
    assert some.returncode == 4
    assert some.stdout.strip() == "No jobs on up; nowhere.invalid could not be read."
    every = ssh_lab.gpumon("jobs", "--hosts", "up")
    assert every.returncode == 0 and every.stdout.strip() == "No jobs."


def test_a_host_without_gpumon_on_its_path_points_at_remote_gpumon(ssh_lab):
    ssh_lab.host("venv").machine.cards = [Card()]
    ssh_lab.hosts["venv"].write()
    doc = json.loads(ssh_lab.gpumon("snapshot", "--hosts", "venv", "--json", remote="gpumon-not-on-path").stdout)
    error = doc["hosts"][0]["error"]
    assert "--remote-gpumon" in error and "[fleet] remote" in error, error
    jobs = ssh_lab.gpumon("jobs", "--hosts", "venv", remote="gpumon-not-on-path")
    assert "--remote-gpumon" in jobs.stderr and "[fleet] remote" in jobs.stderr, jobs.stderr
