"""Claims: every job gpumon launches holds its cards until it ends, so two launches never share a
card by accident; the real program on the fake driver, launches racing from separate processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import GIB, Card

from gpumon.jobs import files


def free_cards(machine, n: int = 3) -> None:
    """`n` idle cards with their own UUIDs; the last is the least loaded."""
    machine.cards = [Card("NVIDIA A40", uuid=f"GPU-{i}{i}{i}{i}cccc-1111-2222-3333-44445555666{i}",
                          bus=f"00000000:{0x31 + i:02X}:00.0", mem_total=48 * GIB,
                          extra=dict(mem_used=(n - i) * GIB // 4, util=0))
                     for i in range(n)]


def wait_for(predicate, timeout: float = 20.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def launch(fake_driver, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpumon", "run", "--interval", "0.2", *args],
                            env=fake_driver.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def jobs(fake_driver) -> list[dict]:
    return json.loads(fake_driver.run("jobs", "--json").stdout)


def claims_of(fake_driver) -> dict[int, list[dict]]:
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    return {g["index"]: g["claims"] for g in doc["gpus"]}


@pytest.fixture
def stop_jobs(fake_driver):
    yield
    for job in jobs(fake_driver):
        if job["state"] in ("running", "queued"):
            fake_driver.run("jobs", "--stop", job["id"])


def test_two_launches_at_once_land_on_different_cards(fake_driver, stop_jobs):
    free_cards(fake_driver.machine)
    fake_driver.write()
    racing = [launch(fake_driver, "--gpu", "auto", "--", "sleep", "60") for _ in range(2)]
    for proc in racing:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    cards = [job["gpu_indices"] for job in jobs(fake_driver)]
    assert len(cards) == 2 and cards[0] != cards[1], cards
    claimed = claims_of(fake_driver)
    assert sorted(i for i, c in claimed.items() if c) == sorted(c[0] for c in cards)


def test_a_card_chosen_2s_ago_is_not_chosen_again(fake_driver, stop_jobs):
    """The first job has not touched its card yet (no memory, no utilisation): only its claim says so."""
    free_cards(fake_driver.machine)
    fake_driver.write()
    first = launch(fake_driver, "--gpu", "auto", "--", "sleep", "60")
    assert first.wait(60) == 0
    time.sleep(2)  # the scenario: a second launch two seconds later
    second = launch(fake_driver, "--gpu", "auto", "--", "sleep", "60")
    assert second.wait(60) == 0
    a, b = (job["gpu_indices"] for job in jobs(fake_driver))
    assert a == [2] and b == [1]  # the least loaded card, then the next one
    select = fake_driver.run("select", "--verbose")
    assert select.returncode == 0
    assert select.stdout.strip() == fake_driver.machine.cards[0].uuid
    assert "GPU 2 skipped: claimed by root: job " in select.stderr and ", since " in select.stderr


def test_kill_9_of_the_supervisor_frees_the_claim(fake_driver, stop_jobs):
    free_cards(fake_driver.machine, 1)
    fake_driver.write()
    assert launch(fake_driver, "--gpu", "auto", "--", "sleep", "60").wait(60) == 0
    job = jobs(fake_driver)[0]
    assert claims_of(fake_driver)[0][0]["job"] == job["id"]
    refused = fake_driver.run("run", "--gpu", "auto", "--", "true")
    assert refused.returncode == 2 and "GPU 0 is claimed by root: job " + job["id"] in refused.stderr
    supervisor = json.loads((files.jobs_dir() / job["id"] / "supervisor.json").read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    wait_for(lambda: not claims_of(fake_driver)[0], what="the claim to go with its holder")
    os.kill(job["pid"], signal.SIGKILL)  # what the supervisor would have stopped


def test_the_claim_ends_with_the_job(fake_driver):
    free_cards(fake_driver.machine, 1)
    fake_driver.write()
    assert fake_driver.run("run", "--interval", "0.2", "--", "true").returncode == 0
    wait_for(lambda: jobs(fake_driver)[0]["state"] == "exited", what="the job to end")
    wait_for(lambda: not claims_of(fake_driver)[0], what="its claim to end")
    place = Path(os.environ["GPUMON_CLAIMS_DIR"])
    assert not [p for p in place.iterdir() if p.name.startswith("claim.")]


def test_a_claimed_card_asked_for_by_number_is_used_after_a_warning(fake_driver, stop_jobs):
    free_cards(fake_driver.machine, 2)
    fake_driver.write()
    assert launch(fake_driver, "--gpu", "1", "--name", "[bold]mine[/]", "--", "sleep", "60").wait(60) == 0
    shared = fake_driver.run("run", "--gpu", "1", "--", "sleep", "60")
    assert shared.returncode == 0
    assert "GPU 1 is claimed by root: job " in shared.stderr and "[bold]mine[/]" in shared.stderr
    assert "starting there as asked" in shared.stderr
    assert [job["gpu_indices"] for job in jobs(fake_driver)] == [[1], [1]]


@pytest.mark.parametrize("problem", ["missing", "unwritable"])
def test_a_place_that_cannot_be_used_refuses_auto_in_one_line_and_a_named_card_still_goes(
        fake_driver, tmp_path, problem, stop_jobs):
    """Where no claim can be made, gpumon cannot be sure the card it would choose is nobody's:
    `--gpu auto` is refused in one line, at once; a card the user names still starts, told so."""
    free_cards(fake_driver.machine, 1)
    fake_driver.write()
    env = dict(fake_driver.env)
    if problem == "missing":
        env["GPUMON_CLAIMS_DIR"] = str(tmp_path / "no" / "such" / "folder")
    else:
        place = tmp_path / "plain"
        place.mkdir(mode=0o777)
        os.chmod(place, 0o777)  # world-writable but not sticky: anyone could remove a claim
        env["GPUMON_CLAIMS_DIR"] = str(place)
    started = time.monotonic()
    refused = subprocess.run([sys.executable, "-m", "gpumon", "run", "--", "sleep", "60"], env=env,
                             capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < 30
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    assert "--gpu auto is refused" in refused.stderr and "(name a card, --gpu N" in refused.stderr
    assert "job " not in refused.stdout
    named = subprocess.run([sys.executable, "-m", "gpumon", "run", "--gpu", "0", "--", "sleep", "60"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert named.returncode == 0, named.stderr
    notes = [line for line in named.stderr.splitlines() if "claims:" in line]
    assert len(notes) == 1, named.stderr
    assert "on GPU 0" in named.stdout


@pytest.mark.parametrize("trap", ["held", "fifo", "directory", "link"])
def test_nothing_held_or_planted_in_the_place_makes_a_launch_go_without_claims(fake_driver, tmp_path, trap, stop_jobs):
    """The old lock's name, held by anyone (flock works on a read-only descriptor) or planted as
    a FIFO, a folder or a link: launches still claim, and never wait on it."""
    free_cards(fake_driver.machine, 2)
    fake_driver.write()
    place = Path(fake_driver.env["GPUMON_CLAIMS_DIR"])
    place.mkdir(mode=0o1777)
    held = None
    if trap == "held":
        (place / "place.lock").write_text("")
        held = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1]); "
                                 "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)",
                                 str(place / "place.lock")], stdout=subprocess.PIPE, text=True)
        assert held.stdout.readline() == "locked\n"
    elif trap == "fifo":
        os.mkfifo(place / "place.lock")
    elif trap == "directory":
        (place / "place.lock").mkdir()
    else:
        (place / "place.lock").symlink_to(tmp_path / "elsewhere")
    try:
        started = time.monotonic()
        first = fake_driver.run("run", "--gpu", "auto", "--", "sleep", "60")
        second = fake_driver.run("run", "--gpu", "auto", "--", "sleep", "60")
        assert time.monotonic() - started < 30
    finally:
        if held is not None:
            held.kill()
            held.wait()
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "claims:" not in first.stderr + second.stderr
    assert sorted(i for job in jobs(fake_driver) for i in job["gpu_indices"]) == [0, 1]  # one card each
    assert len([p for p in place.iterdir() if p.name.startswith("claim.")]) == 2
    assert not (tmp_path / "elsewhere").exists()


def test_failover_never_moves_a_job_to_a_claimed_card(fake_driver, tmp_path, stop_jobs):
    from test_failover import run_job, started_runs, starts_script, three_cards

    uuids = three_cards(fake_driver)
    starts = tmp_path / "starts"
    assert run_job(fake_driver, "--gpu", "0", "--failover", "1", "--name", "mover", "--",
                   *starts_script(starts)).returncode == 0
    started_runs(starts, 1)
    # Card 1 is free (the job there has touched nothing yet) and first in line, but claimed.
    assert fake_driver.run("run", "--gpu", "1", "--name", "holder", "--", "sleep", "60").returncode == 0
    fake_driver.machine.xids = [dict(gpu=0, at=0, code=79)]
    fake_driver.write()
    (_, (_, given)) = started_runs(starts, 2)
    assert given == uuids[2]
    mover = wait_for(lambda: next((j for j in jobs(fake_driver) if j["name"] == "mover" and j["state"] == "running"
                                   and j["gpu_indices"] == [2]), None), what="the move")
    assert claims_of(fake_driver)[2][0]["job"] == mover["id"] and not claims_of(fake_driver)[0]
