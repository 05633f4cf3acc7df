"""Inside an allocation (a Slurm job's or a container's CUDA_VISIBLE_DEVICES, inherited beside
SLURM_JOB_ID or the container toolkit's NVIDIA_VISIBLE_DEVICES; a shell's own earlier `select
--export` is no allocation: tests/test_select_export.py picks again there): `select`,
`run --gpu auto` and the queue choose only among the cards it grants, by their real identity; a card
named outside it starts after a line saying so; a request the allocation could never meet is refused."""

from __future__ import annotations

import json

import test_claims
from fakedrm import RX7900, RX7900_HWMON
from test_claims import free_cards, jobs

stop_jobs = test_claims.stop_jobs


def _in(fake_driver, visible: str, *args: str):
    import subprocess
    import sys

    env = {**fake_driver.env, "CUDA_VISIBLE_DEVICES": visible, "SLURM_JOB_ID": "4242"}
    return subprocess.run([sys.executable, "-m", "gpumon", *args], env=env, capture_output=True, text=True, timeout=60)


def test_auto_select_and_the_queue_stay_inside_the_allocation(fake_driver, stop_jobs):
    free_cards(fake_driver.machine, 4)  # the last is the least loaded: auto's first choice outside an allocation
    fake_driver.write()
    uuids = [c.uuid for c in fake_driver.machine.cards]
    outside = fake_driver.run("select")
    assert outside.stdout.strip() == uuids[3]
    # Slurm gave this shell cards 1 and 2 (one model: CUDA's order is the PCI order, so integers are certain).
    inside = _in(fake_driver, "1,2", "select", "--verbose")
    assert inside.returncode == 0, inside.stderr
    assert inside.stdout.strip() == uuids[2]
    assert "GPU 3 skipped: outside this allocation (Slurm job 4242: CUDA_VISIBLE_DEVICES=1,2)" in inside.stderr
    by_uuid = _in(fake_driver, f"{uuids[0]}", "select")
    assert by_uuid.stdout.strip() == uuids[0]

    ran = _in(fake_driver, "1,2", "run", "--gpu", "auto", "--", "sleep", "60")
    assert ran.returncode == 0, ran.stderr
    assert jobs(fake_driver)[-1]["gpu_indices"] == [2]
    too_many = _in(fake_driver, "1,2", "run", "--wait", "--gpu", "auto:3", "--", "true")
    assert too_many.returncode == 2
    assert "asks for 3 cards; this allocation grants 2 that could run it" in too_many.stderr

    named = _in(fake_driver, "1,2", "run", "--gpu", "3", "--", "sleep", "60")
    assert named.returncode == 0, named.stderr
    assert ("GPU 3 is outside this allocation (Slurm job 4242: CUDA_VISIBLE_DEVICES=1,2): the job may not be able "
            "to open it; starting there as asked") in named.stderr
    doc = json.loads(fake_driver.run("jobs", "--json").stdout)
    assert sorted(i for job in doc for i in job["gpu_indices"]) == [2, 3]


def test_an_amd_allocation_is_read_from_rocr_visible_devices(fake_kernel):
    """A Slurm job on AMD cards: Slurm sets ROCR_VISIBLE_DEVICES (ROCm's numbers) for its GRES."""
    for i in range(3):
        fake_kernel.sys.amd(address=f"0000:0{3 + i}:00.0", files=RX7900, hwmon=RX7900_HWMON, number=i)
    allocation = {**fake_kernel.env, "ROCR_VISIBLE_DEVICES": "1", "SLURM_JOB_ID": "77"}
    outside = fake_kernel.run("select", "--count", "3")
    assert outside.returncode == 0, outside.stderr
    every = outside.stdout.strip().split(",")
    inside = fake_kernel.run("select", "--verbose", env=allocation)
    assert inside.returncode == 0, inside.stderr
    assert "GPU 0 skipped: outside this allocation (Slurm job 77: ROCR_VISIBLE_DEVICES=1)" in inside.stderr
    assert inside.stdout.strip() in every
    assert fake_kernel.run("select", "--count", "2", env=allocation).returncode == 1, "it grants one card"
