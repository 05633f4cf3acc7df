"""What a job's supervisor promises, kept when things go wrong: a full disk never ends the watch (the
watchdog still stops the job at its limit, and the end is recorded once there is room); a card's
limit (`m`) holds on every job that lands on the card; and a job whose supervisor is gone says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import GIB, IN_CI, Card, require_tool
from test_failover import set_card, started_runs, starts_script, three_cards
from test_job_lifecycle import pid_script, state_of
from test_jobs import four_cards, job_json, run_job, wait_for
from test_tui import run, started
from test_tui_host import app_on, wait_until
from textual.widgets import DataTable

from gpumon.jobs import files
from gpumon.jobs.limits import card_limits
from gpumon.tui.jobs.screen import JobsScreen


def gone(pid: int) -> bool:
    return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def end_job(job: dict) -> None:
    """A test's job and its supervisor, ended by the pids it recorded (a failing test leaves none)."""
    directory = Path(job["log"]).parent
    for record in ("supervisor.json", "process.json"):
        try:
            pid = json.loads((directory / record).read_text())["pid"]
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


@pytest.fixture
def tiny_state_disk():
    """The state folder on a real 2 MiB tmpfs, and a way to fill it up; unmounted at the end."""
    require_tool("mount")
    if os.geteuid() != 0:
        if IN_CI:
            pytest.fail("the tmpfs test runs as root in CI")
        pytest.skip("mounting a tmpfs needs root")
    where = files.state_dir()
    where.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(where)], check=True)
    filler = where / "filler"

    def fill() -> None:
        with open(filler, "wb", buffering=0) as f:
            for chunk in (65536, 4096, 1):
                try:
                    while True:
                        f.write(b"\0" * chunk)
                except OSError:
                    pass

    fill.filler = filler  # type: ignore[attr-defined]
    yield fill
    for job in list(where.glob("jobs/*")):
        end_job({"log": str(job / "output.log")})
    if subprocess.run(["umount", str(where)]).returncode != 0:
        subprocess.run(["umount", "-l", str(where)], check=True)  # a process still there lets go of it later


def test_a_full_disk_never_ends_the_watchdog(fake_driver, tmp_path, tiny_state_disk):
    four_cards(fake_driver.machine)
    fake_driver.write()
    pid_file = tmp_path / "pid"
    result = run_job(fake_driver, "--gpu", "2", "--mem-limit", "2G", "--", *pid_script(pid_file))
    assert result.returncode == 0, result.stderr
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid"))
    (job,) = job_json(fake_driver)
    supervisor = json.loads((Path(job["log"]).parent / "supervisor.json").read_text())["pid"]

    tiny_state_disk()  # no record can be written from now on
    with pytest.raises(OSError):
        files.write_atomic(files.state_dir() / "probe", "x")
    fake_driver.machine.procs = [dict(gpu=2, pid=pid, mem=3 * GIB)]  # over its limit
    fake_driver.write()
    wait_for(lambda: gone(pid), what="the watchdog to stop the job on a full disk")
    assert not gone(supervisor), "the supervisor waits to record the end"

    tiny_state_disk.filler.unlink()  # room again: the end is recorded
    job = state_of(fake_driver, "killed")
    assert job["reason"] == "memory limit exceeded on GPU 2: 3.0 GiB > 2.0 GiB"
    assert job["peak_gpu_memory"] == 3 * GIB
    wait_for(lambda: gone(supervisor), what="the supervisor to leave")


def limit_cards(fake_driver) -> list[str]:
    """Four free cards, with a default limit (`m`) on cards 0 (4 GiB), 1 (8 GiB) and 3 (2 GiB)."""
    four_cards(fake_driver.machine)
    for card in fake_driver.machine.cards:
        card.extra.update(mem_used=0, util=0)
    fake_driver.machine.cards[2].extra.update(mem_used=30 * GIB, util=50)  # auto placement avoids it
    fake_driver.write()
    uuids = [c.uuid for c in fake_driver.machine.cards]
    limits = card_limits()
    for index, limit in ((0, 4 * GIB), (1, 8 * GIB), (3, 2 * GIB)):
        limits.set(uuids[index], limit)
    return uuids


def test_a_cards_limit_holds_on_every_card_of_a_multi_card_job(fake_driver, tmp_path):
    uuids = limit_cards(fake_driver)
    pid_file = tmp_path / "pid"
    result = run_job(fake_driver, "--gpu", "0,1", "--", *pid_script(pid_file))
    assert result.returncode == 0, result.stderr
    assert "memory limit GPU 0 4.0G, GPU 1 8.0G (per card): watchdog" in result.stdout, result.stdout
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid"))
    (job,) = job_json(fake_driver)
    assert job["mem_limits"] == {uuids[0]: 4 * GIB, uuids[1]: 8 * GIB} and job["mem_limit"] == 4 * GIB
    fake_driver.machine.procs = [dict(gpu=0, pid=pid, mem=3 * GIB), dict(gpu=1, pid=pid, mem=6 * GIB)]
    fake_driver.write()
    time.sleep(1.0)  # five watchdog samples: each card within its own limit
    assert job_json(fake_driver)[0]["state"] == "running"
    fake_driver.machine.procs[0]["mem"] = 5 * GIB
    fake_driver.write()
    assert state_of(fake_driver, "killed")["reason"] == "memory limit exceeded on GPU 0: 5.0 GiB > 4.0 GiB"


@pytest.mark.parametrize("how", [("--gpu", "3", "--wait"), ("--gpu", "auto")], ids=["queued", "auto"])
def test_a_cards_limit_holds_on_a_queued_or_auto_placed_job(fake_driver, tmp_path, how):
    uuids = limit_cards(fake_driver)
    for index in (0, 1):  # auto placement takes the free card, 3
        fake_driver.machine.cards[index].extra.update(mem_used=30 * GIB, util=50)
    fake_driver.write()
    pid_file = tmp_path / "pid"
    result = run_job(fake_driver, *how, "--", *pid_script(pid_file))
    assert result.returncode == 0, result.stderr
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid"))
    job = state_of(fake_driver, "running")
    assert job["gpu_indices"] == [3], job
    assert job["mem_limits"] == {uuids[3]: 2 * GIB} and job["mem_limit"] == 2 * GIB
    fake_driver.machine.procs = [dict(gpu=3, pid=pid, mem=3 * GIB)]
    fake_driver.write()
    assert state_of(fake_driver, "killed")["reason"] == "memory limit exceeded on GPU 3: 3.0 GiB > 2.0 GiB"


def test_a_cards_limit_holds_after_a_failover_move(fake_driver, tmp_path):
    uuids = three_cards(fake_driver, busy=(2,))
    card_limits().set(uuids[1], 2 * GIB)  # none on card 0, where the job starts
    starts = tmp_path / "starts"
    assert run_job(fake_driver, "--gpu", "0", "--failover", "1", "--", *starts_script(starts)).returncode == 0
    started_runs(starts, 1)
    assert job_json(fake_driver)[0]["mem_limits"] == {}
    set_card(fake_driver, 0, lost_after=0)
    (_, (second, given)) = started_runs(starts, 2)
    assert given == uuids[1]
    job = wait_for(lambda: (job := job_json(fake_driver)[0])["pid"] == second and job, what="the move")
    assert job["mem_limits"] == {uuids[1]: 2 * GIB}
    fake_driver.machine.procs = [dict(gpu=1, pid=second, mem=3 * GIB)]
    fake_driver.write()
    reason = state_of(fake_driver, "killed")["reason"]
    assert reason.startswith("memory limit exceeded on GPU 1: ") and reason.endswith(" > 2.0 GiB"), reason


def test_a_job_whose_supervisor_is_gone_is_unsupervised(fake_driver):
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.write()
    assert run_job(fake_driver, "--gpu", "0", "--mem-limit", "1G", "--name", "orphan", "--",
                   "sleep", "60").returncode == 0
    (job,) = job_json(fake_driver)
    assert job["supervised"] is True
    supervisor = json.loads((Path(job["log"]).parent / "supervisor.json").read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: gone(supervisor), what="the supervisor to be gone")

    (job,) = job_json(fake_driver)
    assert (job["state"], job["supervised"]) == ("running", False)
    assert "no memory limit, no failover, no end record" in job["reason"]
    listing = fake_driver.run("jobs").stdout
    assert "unsupervised" in listing and "no memory limit" in listing, listing
    across = json.loads(fake_driver.run("jobs", "--hosts", "local", "--json").stdout)
    assert [(j["state"], j["supervised"]) for j in across] == [("running", False)]
    assert "unsupervised" in fake_driver.run("jobs", "--hosts", "local").stdout

    backend, app = app_on(fake_driver, fake_driver.machine.cards)

    async def go():
        async with app.run_test(size=(160, 40)) as pilot:
            await started(pilot)
            await pilot.press("J")
            screen = app.screen
            assert isinstance(screen, JobsScreen)
            await wait_until(pilot, lambda: screen.jobs, "the job in J")
            assert str(screen.query_one(DataTable).get_row_at(0)[2]) == "unsupervised"

    try:
        run(go())
    finally:
        backend.close()
    assert fake_driver.run("jobs", "--stop", "orphan").returncode == 0
    wait_for(lambda: gone(job["pid"]), what="the command to stop")
    assert state_of(fake_driver, "killed")["supervised"] is None


def test_the_flag_is_kept_in_the_schema():
    from gpumon.fleet.schema import SchemaError, jobs_from_remote

    base = {"id": "j", "state": "running", "supervised": False, "mem_limits": {"GPU-1": GIB}}
    (job,) = jobs_from_remote([base])
    assert job["supervised"] is False and job["mem_limits"] == {"GPU-1": GIB}
    for bad in ({"supervised": "no"}, {"mem_limits": [1]}, {"mem_limits": {"GPU-1": "1G"}}):
        with pytest.raises(SchemaError):
            jobs_from_remote([base | bad])


def test_a_limit_that_cannot_be_watched_stops_the_job(fake_driver, tmp_path):
    """The driver goes away under a job with a limit: its memory cannot be read, so the job is
    stopped (after BLIND_S) rather than left to grow unwatched; one without a limit runs on."""
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB), Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.write()
    assert run_job(fake_driver, "--gpu", "0", "--mem-limit", "1G", "--name", "capped", "--",
                   "sleep", "120").returncode == 0
    assert run_job(fake_driver, "--gpu", "1", "--name", "free", "--", "sleep", "120").returncode == 0
    fake_driver.machine.driver_unloaded = True
    fake_driver.write()
    (capped,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["name"] == "capped" and j["state"] == "killed"],
                         timeout=40, what="the blind watchdog to stop the capped job")
    assert capped["reason"].startswith("stopped by gpumon: its memory limit could not be watched for 10 s (GPU 0: ")
    assert "driver" in capped["reason"], capped["reason"]
    (free,) = [j for j in job_json(fake_driver) if j["name"] == "free"]
    assert free["state"] == "running" and free["supervised"] is True
    fake_driver.machine.driver_unloaded = False
    fake_driver.write()
    assert fake_driver.run("jobs", "--stop", "free").returncode == 0
    wait_for(lambda: [j for j in job_json(fake_driver) if j["name"] == "free" and j["state"] == "killed"],
             what="the stop")
