"""A card's compute mode (`nvidia-smi -c`), read from the driver: an exclusive card that already
runs a process, or a prohibited one, is never chosen by `auto` or `select` (a job placed there fails
at its first CUDA call); naming it starts there after a line saying what will happen."""

from __future__ import annotations

import json

import test_claims
from conftest import GIB, Card
from test_claims import jobs

stop_jobs = test_claims.stop_jobs
MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}


def _cards(fake_driver, worker_pid: int) -> None:
    """GPU 0: exclusive, holding one process (the least loaded card all the same); GPU 1: prohibited;
    GPU 2: exclusive and empty; GPU 3: default, a little busier."""
    fake_driver.machine.cards = [
        Card("NVIDIA A100", uuid=f"GPU-{i}{i}{i}{i}eeee-1111-2222-3333-44445555666{i}",
             bus=f"00000000:{0x41 + i:02X}:00.0", mem_total=80 * GIB,
             extra=dict(compute_mode=mode, util=0, mem_used=(1 + i) * GIB // 2))
        for i, mode in enumerate((MODES["exclusive_process"], MODES["prohibited"], MODES["exclusive_process"],
                                  MODES["default"]))]
    fake_driver.machine.procs = [dict(gpu=0, pid=worker_pid, mem=GIB // 4, sm=0)]
    fake_driver.write()


def test_exclusive_and_prohibited_cards_are_read_shown_and_never_chosen(fake_driver, idle_processes, stop_jobs):
    worker = idle_processes()
    _cards(fake_driver, worker.pid)
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    assert [g["compute_mode"] for g in doc["gpus"]] == ["exclusive_process", "prohibited", "exclusive_process",
                                                       "default"]
    table = fake_driver.run("snapshot").stdout
    assert "GPU 0: compute mode EXCLUSIVE_PROCESS (one process at a time)" in table
    assert "GPU 1: compute mode PROHIBITED" in table and "GPU 3: compute mode" not in table

    select = fake_driver.run("select", "--count", "2", "--verbose")
    assert select.returncode == 0, select.stderr
    assert "GPU 0 skipped: compute mode EXCLUSIVE_PROCESS and already running a process" in select.stderr
    assert "GPU 1 skipped: compute mode PROHIBITED" in select.stderr
    assert sorted(select.stdout.split()[0].split(",")) == sorted([doc["gpus"][2]["uuid"], doc["gpus"][3]["uuid"]])

    auto = fake_driver.run("run", "--gpu", "auto", "--", "sleep", "60")
    assert auto.returncode == 0, auto.stderr
    assert jobs(fake_driver)[-1]["gpu_indices"] == [2]  # the exclusive card nobody uses yet
    named = fake_driver.run("run", "--gpu", "0", "--", "sleep", "60")
    assert named.returncode == 0, named.stderr
    assert ("GPU 0 is in compute mode EXCLUSIVE_PROCESS and already running a process: a second fails at its "
            "first CUDA call; starting there as asked") in named.stderr


def test_a_driver_without_compute_mode_reads_null(fake_driver):
    fake_driver.machine.cards = [Card("NVIDIA A100", extra=dict(unsupported="compute_mode"))]
    fake_driver.write()
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    assert doc["gpus"][0]["compute_mode"] is None
    assert fake_driver.run("select").returncode == 0
