"""Cards a real Slurm (tests/slurm_lab.py) has given a job as GRES count as taken, and as the job's:
the lab's node lists two GPUs on devices with minor numbers 3 and 5; the fake driver's cards have
the same minor numbers, so Slurm's gpu 0 is NVML card 0 — the card auto would choose before. A
job of the lab's user asks for one with `--gres=gpu:1` and only sleeps: none of its processes is
on the card, and gpumon (here root, outside the job) must still leave that card alone."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import test_claims
from conftest import Card
from slurm_lab import GPU_MINORS, USER, real_slurm  # noqa: F401 - the fixture
from test_claims import jobs

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.owners.holders import card_holder
from gpumon.tui.app import create_app

pytestmark = pytest.mark.xdist_group("slurm")
stop_jobs = test_claims.stop_jobs

SLEEPER = "#!/bin/sh\nsleep 600\n"


@pytest.fixture
def slurm(real_slurm, monkeypatch):  # noqa: F811 - the fixture imported above
    monkeypatch.setenv("SLURM_CONF", str(real_slurm.conf))  # gpumon runs on the lab's node
    yield real_slurm
    real_slurm.cancel_all()


@pytest.fixture
def one_card_taken(slurm, fake_driver) -> str:
    """Two idle cards whose minor numbers are the lab's devices; a job of the lab's user holding
    Slurm's gpu 0 (NVML card 0), running: its id."""
    fake_driver.machine.cards = [Card(extra={"minor": minor, "util": 0, "mem_used": 0}) for minor in GPU_MINORS]
    fake_driver.write()
    job = slurm.submit(SLEEPER, "--gres=gpu:1")
    slurm.step_pids(job, "sleep", {"batch"})
    assert "IDX:0)" in slurm.run("scontrol", "-d", "show", "job", job)  # what the lab's Slurm says
    return job


def uuids(fake_driver) -> list[str]:
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    return [g["uuid"] for g in doc["gpus"]]


def test_select_answers_the_card_slurm_has_not_given(one_card_taken, fake_driver):
    job = one_card_taken
    chosen = fake_driver.run("select", "--verbose")
    assert chosen.returncode == 0, chosen.stderr
    assert chosen.stdout.strip() == uuids(fake_driver)[1]
    assert f"GPU 0 skipped: allocated by Slurm to job {job} ({USER})" in chosen.stderr
    # Inside that job (its environment, as slurmstepd sets it) its own card is the one to choose.
    cards = uuids(fake_driver)
    inside = subprocess.run([sys.executable, "-m", "gpumon", "select", "--verbose"], capture_output=True, text=True,
                            timeout=60, env={**fake_driver.env, "SLURM_JOB_ID": job, "CUDA_VISIBLE_DEVICES": cards[0]})
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.strip() == cards[0]
    assert "allocated by Slurm" not in inside.stderr


def test_run_auto_lands_on_the_other_card_and_a_named_one_warns(one_card_taken, fake_driver, stop_jobs):
    job = one_card_taken
    auto = fake_driver.run("run", "--gpu", "auto", "--", "sleep", "60")
    assert auto.returncode == 0, auto.stderr
    assert jobs(fake_driver)[-1]["gpu_indices"] == [1]
    named = fake_driver.run("run", "--gpu", "0", "--", "sleep", "60")
    assert named.returncode == 0, named.stderr
    warnings = [line for line in named.stderr.splitlines() if "Slurm" in line]
    assert warnings == [f"gpumon: GPU 0 is allocated by Slurm to job {job} ({USER}); starting there as asked "
                        "(the card is shared)"]
    assert jobs(fake_driver)[-1]["gpu_indices"] == [0]
    too_many = fake_driver.run("run", "--wait", "--gpu", "auto:2", "--", "true")
    assert too_many.returncode == 2
    assert f"GPU 0: allocated by Slurm to job {job} ({USER})" in too_many.stderr


def test_the_queue_starts_on_the_card_slurm_has_not_given(one_card_taken, fake_driver, stop_jobs):
    queued = fake_driver.run("run", "--wait", "--wait-timeout", "60s", "--interval", "0.2", "--gpu", "auto", "--",
                             "sleep", "60")
    assert queued.returncode == 0, queued.stderr
    started = jobs(fake_driver)[-1]
    assert (started["state"], started["gpu_indices"]) == ("running", [1]), started


def test_the_card_reads_as_the_jobs_in_snapshot_and_users(one_card_taken, fake_driver):
    job = one_card_taken
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    assert [g["owner"] for g in doc["gpus"]] == [f"job {job}", None]
    listed = subprocess.run([sys.executable, "-m", "gpumon", "users", "--window", "2s", "--interval", "0.5"],
                            capture_output=True, text=True, timeout=60, env=fake_driver.env)
    assert listed.returncode == 0, listed.stderr
    assert ["job", job] in [line.split()[:2] for line in listed.stdout.splitlines()], listed.stdout


def test_the_tui_shows_the_card_as_the_jobs(one_card_taken, fake_driver):
    job = one_card_taken
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        async with create_app(backend, interval=0.2).run_test(size=(160, 40)) as pilot:
            app = pilot.app
            deadline = time.monotonic() + 20
            while not any(h.kind == "slurm" for h in app.holding) and time.monotonic() < deadline:
                await pilot.pause(0.05)
            return [(h.label, h.cards) for h in app.holding], [card_holder(g) for g in app.sampler.latest.gpus]

    try:
        holding, holders = asyncio.run(go())
    finally:
        backend.close()
    assert holding == [(f"job {job}", (0,))]
    assert holders == [f"job {job}", None]  # what the card panels show beside the name
