"""A launch on another host counts as launched only when that host's gpumon answers with the job it
made (`gpumon run --json`, checked as a `jobs --json` entry). No answer, a login banner or junk is an
error that names the host and shows, bounded and printable, what it said. Over the real sshd."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import Card

from gpumon.jobs.host import host_at
from gpumon.jobs.launch import LaunchRequest
from gpumon.remote.hosts import parse_hosts
from gpumon.remote.ssh import SshTransport


def fake_gpumon(tmp_path: Path, name: str, body: str) -> str:
    """A `--remote-gpumon` that is not gpumon: it answers as `body` says, whatever it is asked."""
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


ANSWERS = {
    "nothing": ("exit 0", "it answered nothing"),
    "banner": ("echo 'Welcome to h! Unauthorised access is prohibited.'; exit 0",
               "it said “Welcome to h! Unauthorised access is prohibited.”"),
    "junk": ("printf '\\033[2J{\"job\": 5}'; exit 0", "it said “\\x1b[2J{\"job\": 5}”"),
    "a wrong job": (f"echo '{json.dumps({'job': {'id': 'x', 'state': 'flying'}})}'", "(jobs[0].state is unknown)"),
    "a flood": ("head -c 100000 /dev/zero | tr '\\0' 'y'; exit 0", "yyyy…”"),
}


def test_anything_but_the_job_is_an_error_that_says_what_the_host_said(ssh_lab, tmp_path):
    host = ssh_lab.host("h")
    host.machine.cards = [Card()]
    host.write()
    for answer, (body, shown) in ANSWERS.items():
        result = ssh_lab.gpumon("run", "--host", "h", "--gpu", "0", "--", "sleep", "60",
                                remote=fake_gpumon(tmp_path, f"not-gpumon-{len(body)}", body))
        assert result.returncode == 2, (answer, result)
        (line,) = result.stderr.splitlines()
        assert line.startswith("gpumon: error: h: `gpumon run` did not answer with the job it started"), line
        assert shown in line and len(line) < 400 and line.isprintable(), (answer, line)
        assert result.stdout == "", answer


def test_a_real_answer_is_the_job_the_host_made(ssh_lab, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(ssh_lab.runtime_dir))
    lab = ssh_lab.host("h")
    lab.machine.cards = [Card(), Card()]
    lab.write()
    (spec,) = parse_hosts("h")
    there = host_at(spec, SshTransport(ssh_lab.ssh, ssh_lab.remote_gpumon))
    said = there.launch(LaunchRequest(["sleep", "60"], "1", name="real", mem_limit="1G"))
    assert said.startswith("job ") and "GPU 1" in said and "memory limit 1.0G per card" in said, said
    (job,) = there.jobs()
    assert (job["id"], job["state"], job["mem_limits"]) == (said.split()[1], "running", {job["gpus"][0]: 1 << 30})
    there.stop(job["id"])


def test_json_answers_for_the_machine_and_refuses_the_foreground(fake_driver):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    result = fake_driver.run("run", "--json", "--gpu", "0", "--", "sh", "-c", "exit 0")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["job"]["name"] == "exit" and answer["summary"][0].startswith(f"job {answer['job']['id']} ")
    refused = fake_driver.run("run", "--json", "--foreground", "--", "true")
    assert refused.returncode == 2 and refused.stderr.startswith("gpumon: error: --json goes with a detached job")
