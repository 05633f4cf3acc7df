"""The host's queue: `run --wait` jobs of every user start in the order they were queued, each on
free unclaimed cards, never two on one card; --wait-timeout gives up; a queued job whose supervisor
is gone leaves the queue. The real program on the fake driver."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

from conftest import GIB, Card
from test_claims import jobs, wait_for

from gpumon.jobs import files


def machine(fake_driver, busy: list[bool]) -> None:
    fake_driver.machine.cards = [
        Card("NVIDIA A40", uuid=f"GPU-{i}{i}{i}{i}dddd-1111-2222-3333-44445555666{i}",
             bus=f"00000000:{0x41 + i:02X}:00.0", mem_total=48 * GIB,
             extra=dict(mem_used=(40 if b else 1) * GIB, util=90 if b else 0))
        for i, b in enumerate(busy)]
    fake_driver.write()


def queued(fake_driver, *args: str) -> subprocess.CompletedProcess[str]:
    return fake_driver.run("run", "--interval", "0.1", "--wait", *args)


def the_queue(fake_driver) -> list[dict]:
    result = fake_driver.run("queue", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["queue"]


def stop_all(fake_driver) -> None:
    for job in jobs(fake_driver):
        if job["state"] in ("running", "queued"):
            fake_driver.run("jobs", "--stop", job["id"])


def test_queued_jobs_start_in_order_on_different_cards(fake_driver):
    machine(fake_driver, [True, True])
    try:
        names = ["first", "second", "third"]
        for name in names:
            assert queued(fake_driver, "--name", name, "--", "sleep", "60").returncode == 0
        line = the_queue(fake_driver)
        assert [(e["position"], e["name"]) for e in line] == [(1, "first"), (2, "second"), (3, "third")]
        assert all(e["user"] == "root" and e["gpu_spec"] == "auto" for e in line)
        text = fake_driver.run("queue").stdout
        assert "POS" in text and "first" in text.splitlines()[1]

        machine(fake_driver, [False, False])  # both cards free up at once: two jobs, two cards, in order
        wait_for(lambda: [j["state"] for j in jobs(fake_driver)][:2] == ["running", "running"], 30,
                 "the first two to start")
        listed = {j["name"]: j for j in jobs(fake_driver)}
        assert listed["third"]["state"] == "queued"
        assert sorted(listed["first"]["gpu_indices"] + listed["second"]["gpu_indices"]) == [0, 1]
        assert listed["first"]["started"] <= listed["second"]["started"]
        assert [e["name"] for e in the_queue(fake_driver)] == ["third"]
    finally:
        stop_all(fake_driver)


def test_wait_timeout_gives_up_with_a_clear_line(fake_driver):
    machine(fake_driver, [True])
    result = queued(fake_driver, "--wait-timeout", "1s", "--", "true")
    assert result.returncode == 1
    assert "gave up waiting after 1s (--wait-timeout)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    job = jobs(fake_driver)[0]
    assert job["state"] == "failed" and "--wait-timeout" in job["reason"]
    assert the_queue(fake_driver) == []
    bad = fake_driver.run("run", "--wait-timeout", "1s", "--", "true")
    assert bad.returncode == 2 and "--wait-timeout goes with --wait" in bad.stderr


def test_a_queued_job_whose_supervisor_is_gone_leaves_the_queue(fake_driver):
    machine(fake_driver, [True])
    try:
        assert queued(fake_driver, "--name", "doomed", "--", "true").returncode == 0
        assert queued(fake_driver, "--name", "next", "--", "sleep", "60").returncode == 0
        assert [e["name"] for e in the_queue(fake_driver)] == ["doomed", "next"]
        doomed = next(j for j in jobs(fake_driver) if j["name"] == "doomed")
        supervisor = json.loads((files.jobs_dir() / doomed["id"] / "supervisor.json").read_text())["pid"]
        os.kill(supervisor, signal.SIGKILL)
        wait_for(lambda: [e["name"] for e in the_queue(fake_driver)] == ["next"], what="the entry to go")
        assert the_queue(fake_driver)[0]["position"] == 1
        machine(fake_driver, [False])
        wait_for(lambda: next(j for j in jobs(fake_driver) if j["name"] == "next")["state"] == "running", 30,
                 "the next one to start")
    finally:
        stop_all(fake_driver)


def test_queued_jobs_skip_claimed_cards(fake_driver):
    """A card just taken by a job (no memory used yet) is not free for the queue."""
    machine(fake_driver, [False])
    try:
        assert fake_driver.run("run", "--", "sleep", "60").returncode == 0
        assert queued(fake_driver, "--name", "waiting", "--", "sleep", "60").returncode == 0
        time.sleep(1.5)  # the scenario: many of its samples (0.1 s) see the card free of memory, and claimed
        waiting = next(j for j in jobs(fake_driver) if j["name"] == "waiting")
        assert waiting["state"] == "queued"
    finally:
        stop_all(fake_driver)
