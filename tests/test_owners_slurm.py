"""Owners on a real Slurm (tests/slurm_lab.py): jobs a real user submits, their processes found
with `scontrol listpids` and listed on cards by the fake NVIDIA driver, read by the real sampler.
One holder per job whatever its steps, steps inside it; array tasks named `JOB_TASK` by root and
by another user alike; the job from the environment where no Slurm cgroup exists."""

from __future__ import annotations

import time

import pytest
from conftest import GIB, Card
from slurm_lab import USER, real_slurm  # noqa: F401 - the fixture

from gpumon.alerting.holder_rules import alerted
from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import Sampler
from gpumon.owners.holders import HolderTracker
from gpumon.owners.reader import OwnerReader

FAKE_RELOAD_S = 0.1

TWO_STEPS = """#!/bin/sh
srun --overlap -n1 sleep 600 &
sleep 600 &
wait
"""


@pytest.fixture
def slurm(real_slurm):  # noqa: F811 - the fixture imported above
    yield real_slurm
    real_slurm.cancel_all()


def test_a_job_with_a_batch_and_a_numbered_step_is_one_holder(slurm, fake_driver):
    job = slurm.submit(TWO_STEPS)
    pids = slurm.step_pids(job, "sleep", {"batch", "0"})
    batch, step0 = pids["batch"][0], pids["0"][0]
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=batch, mem=2 * GIB, sm=0), dict(gpu=1, pid=step0, mem=3 * GIB, sm=0)]
    fake_driver.write()
    time.sleep(FAKE_RELOAD_S)
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        snapshot = Sampler(backend).collect()
    finally:
        backend.close()
    owners = {p.pid: p.owner for g in snapshot.gpus for p in g.processes}
    assert (owners[batch].id, owners[step0].id) == (f"{job}.batch", f"{job}.0")
    holders = HolderTracker().update(snapshot)
    jobs = [h for h in holders if h.kind == "slurm"]
    assert [(h.id, h.label, h.user, h.cards, h.processes, h.gpu_memory) for h in jobs] == \
           [(job, f"job {job}", USER, (0, 1), 2, 5 * GIB)]
    assert [(s.id, s.label, s.cards) for s in jobs[0].steps] == [(f"{job}.0", "step 0", (1,)),
                                                                 (f"{job}.batch", "step batch", (0,))]
    # The idle rule fires once for the job (its user's row is not alerted while a job names it).
    assert [h.id for h in alerted(holders)] == [job]
