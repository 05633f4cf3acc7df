"""Failover (`gpumon run --failover N`): a job whose card fails is stopped and started again on a
healthy card, as the fake driver shows it (scan_env: a process is listed on the card its
CUDA_VISIBLE_DEVICES names); and what must never move a job: a busy card, a program's own XID, an
error exit on a healthy card. `watch` reports each move."""

from __future__ import annotations

import json
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import GIB, Card
from test_jobs import job_json, run_job, wait_for
from test_tui import run, started
from test_tui_dialogs import wait_until

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.failover_event import FailoverEvent
from gpumon.jobs import records
from gpumon.jobs.launch import LaunchRequest
from gpumon.jobs.remote_launch import run_args
from gpumon.jobs.supervision.job_events import EventFollower, append, event_log
from gpumon.tui.app import create_app
from gpumon.tui.jobs.screen import JobsScreen
from gpumon.tui.screens.run_dialog import RunDialog


def three_cards(fake_driver, busy: tuple[int, ...] = ()) -> list[str]:
    """Three free A100s (`busy` ones 90 % utilised); their UUIDs, new for each test, so that no
    process left by another test (scan_env lists every process pinned to a UUID) is on them."""
    token = secrets.token_hex(2)
    uuids = [f"GPU-{i}{i}{i}{i}fa11-{token}-1111-2222-33334444555{i}" for i in range(3)]
    fake_driver.machine.scan_env = True
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-40GB", uuid=uuid, mem_total=40 * GIB) for uuid in uuids]
    for i in busy:
        fake_driver.machine.cards[i].extra["util"] = 90
    fake_driver.write()
    return uuids


@pytest.fixture(autouse=True)
def _stop_jobs_left_running(fake_driver):
    """A failing test must not leave its job running (its supervisor stops it and records why)."""
    yield
    for job in job_json(fake_driver):
        if job["state"] in ("running", "queued"):
            fake_driver.run("jobs", "--stop", job["id"])
    wait_for(lambda: all(j["state"] not in ("running", "queued") for j in job_json(fake_driver)),
             what="the test's jobs to stop")


def set_card(fake_driver, index: int, **extra) -> None:
    """Change one card of the running machine (a value None removes the setting)."""
    card = fake_driver.machine.cards[index]
    for key, value in extra.items():
        if value is None:
            card.extra.pop(key, None)
        else:
            card.extra[key] = value
    fake_driver.write()


def starts_script(starts: Path, seconds: int = 600) -> list[str]:
    """A job that notes each of its starts (pid and the cards it was given), then runs."""
    return [sys.executable, "-c",
            f"import os, time; open({str(starts)!r}, 'a').write(f\"{{os.getpid()}} "
            f"{{os.environ['CUDA_VISIBLE_DEVICES']}}\\n\"); time.sleep({seconds})"]


def started_runs(starts: Path, count: int) -> list[tuple[int, str]]:
    lines = wait_for(lambda: starts.exists() and len(lines := starts.read_text().splitlines()) >= count and lines,
                     what=f"start {count} of the job")
    return [(int(pid), cards) for pid, cards in (line.split() for line in lines)]


def cards_of(fake_driver, pid: int) -> set[int]:
    """The cards NVML lists the process on, as a fresh `gpumon snapshot --json` reads them."""
    snapshot = json.loads(fake_driver.run("snapshot", "--json").stdout)
    return {g["index"] for g in snapshot["gpus"] for p in g["processes"] if p["pid"] == pid}


def the_job(fake_driver) -> dict:
    (job,) = job_json(fake_driver)
    return job


@pytest.fixture
def watching(fake_driver):
    """A real `gpumon watch` (JSON lines) whose failover events the test reads."""
    procs: list[subprocess.Popen] = []

    def start(hook_out: Path) -> subprocess.Popen:
        hook = (f"printf '%s ' \"$GPUMON_EVENT\" \"$GPUMON_JOB\" \"$GPUMON_FROM_GPU\" \"$GPUMON_TO_GPU\" "
                f"> {shlex.quote(str(hook_out))}")
        proc = subprocess.Popen([sys.executable, "-m", "gpumon", "watch", "--metrics", "--interval", "0.2",
                                 "--format", "jsonl", "--on-alert", hook], env=fake_driver.env,
                                stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert json.loads(proc.stdout.readline())["event"] == "sample"  # following the event log now
        return proc

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def next_event(proc: subprocess.Popen, kind: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line and (event := json.loads(line))["event"] == kind:
            return event
    raise AssertionError(f"no {kind} event from watch")


def test_a_job_whose_card_is_lost_starts_again_on_a_free_card_and_only_there(fake_driver, tmp_path, watching):
    uuids = three_cards(fake_driver, busy=(2,))
    starts = tmp_path / "starts"
    result = run_job(fake_driver, "--gpu", "0", "--failover", "2", "--", *starts_script(starts))
    assert result.returncode == 0, result.stderr
    assert "failover: moves to other cards if its card fails, up to 2 times" in result.stdout
    ((first, given),) = started_runs(starts, 1)
    assert given == uuids[0] and cards_of(fake_driver, first) == {0}
    watch = watching(tmp_path / "hook")

    set_card(fake_driver, 1, util=90)  # no card is free when card 0 goes: the job waits, like --wait
    set_card(fake_driver, 0, lost_after=0)
    queued = wait_for(lambda: (job := the_job(fake_driver))["state"] == "queued" and job, what="the job to wait")
    assert queued["reason"] == "waiting for free cards to move to, after GPU 0 is lost"
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    set_card(fake_driver, 1, util=None)  # card 1 frees up

    (_, (second, given)) = started_runs(starts, 2)
    assert given == uuids[1]
    set_card(fake_driver, 0, lost_after=None)  # back after a reset: its processes can be listed again
    assert cards_of(fake_driver, second) == {1}, "the job runs on card 1, and only there"
    assert cards_of(fake_driver, first) == set()
    job = wait_for(lambda: (job := the_job(fake_driver))["state"] == "running" and job, what="running again")
    assert job["pid"] == second and job["gpu_indices"] == [1] and job["failover"] == 2
    one, two = job["attempts"]
    assert (one["attempt"], one["gpu_indices"], one["pid"], one["signal"]) == (1, [0], first, "SIGTERM")
    assert one["moved_because"] == "GPU 0 is lost" and one["ended"] <= two["started"]
    assert (two["attempt"], two["gpus"], two["pid"], two["ended"], two["moved_because"]) == (2, [uuids[1]], second,
                                                                                          None, None)

    event = next_event(watch, "failover")
    assert {k: event[k] for k in ("job", "from", "to", "from_uuids", "to_uuids", "reason", "attempt")} == {
        "job": job["id"], "from": [0], "to": [1], "from_uuids": [uuids[0]], "to_uuids": [uuids[1]],
        "reason": "GPU 0 is lost", "attempt": 2}
    assert event["host"] == job["host"]
    hook = wait_for(lambda: (tmp_path / "hook").exists() and (tmp_path / "hook").read_text(), what="the hook")
    assert hook == f"failover {job['id']} 0 1 "

    log = Path(job["log"]).read_text()
    marks = [line for line in log.splitlines() if line.startswith("=== gpumon: attempt")]
    assert len(marks) == 2 and marks[1].startswith("=== gpumon: attempt 2 of at most 3 on GPU 1, after GPU 0 is lost (")
    listing = fake_driver.run("jobs").stdout
    assert "attempt 1: GPU 0," in listing and "SIGTERM; moved: GPU 0 is lost" in listing
    assert "attempt 2: GPU 1, since" in listing


def test_a_fatal_xid_on_its_card_moves_the_job(fake_driver, tmp_path):
    uuids = three_cards(fake_driver, busy=(2,))
    starts = tmp_path / "starts"
    run_job(fake_driver, "--gpu", "0", "--failover", "1", "--", *starts_script(starts))
    ((first, _),) = started_runs(starts, 1)
    fake_driver.machine.xids = [dict(gpu=0, at=0, code=79)]  # delivered to the supervisor at once
    fake_driver.write()
    (_, (second, given)) = started_runs(starts, 2)
    assert given == uuids[1]
    # Card 0 still answers (an XID 79 before NVML says GPU_IS_LOST): the job is not there any more.
    assert cards_of(fake_driver, second) == {1} and cards_of(fake_driver, first) == set()
    job = wait_for(lambda: (job := the_job(fake_driver))["state"] == "running" and job, what="running again")
    assert job["attempts"][0]["moved_because"] == "XID 79 on GPU 0: fell off the bus"


def test_a_card_whose_fabric_failed_moves_the_job(fake_driver, tmp_path):
    uuids = three_cards(fake_driver, busy=(2,))
    for card in fake_driver.machine.cards:  # an NVSwitch board; card 0's registration failed
        card.extra.update(switch_links=18, fabric="completed")
    fake_driver.machine.cards[0].extra["fabric_status"] = 999
    fake_driver.write()
    starts = tmp_path / "starts"
    run_job(fake_driver, "--gpu", "0", "--failover", "1", "--", *starts_script(starts))
    job = wait_for(lambda: (job := the_job(fake_driver))["state"] == "running" and len(job["attempts"]) == 2 and job,
                   what="running again")  # (stopped at its first sample: it may not have started at all)
    assert job["attempts"][0]["moved_because"] == "GPU 0: its NVSwitch fabric registration failed"
    second, given = wait_for(lambda: [run for run in started_runs(starts, 1) if run[0] == job["pid"]],
                             what="the second start")[0]
    assert given == uuids[1] and cards_of(fake_driver, second) == {1}


def test_a_busy_card_or_a_programs_own_xid_never_moves_a_job(fake_driver, tmp_path):
    uuids = three_cards(fake_driver)
    starts = tmp_path / "starts"
    run_job(fake_driver, "--gpu", "0", "--failover", "2", "--", *starts_script(starts))
    ((first, _),) = started_runs(starts, 1)
    # Someone else fills card 0 to the brim and runs it flat out; the job's own program faults (XID 13).
    set_card(fake_driver, 0, util=100, mem_used=39 * GIB)
    fake_driver.machine.xids = [dict(gpu=0, at=0, code=13), dict(gpu=0, at=0.5, code=31)]
    fake_driver.write()
    time.sleep(4.0)  # twenty samples of the supervisor
    job = the_job(fake_driver)
    assert job["state"] == "running" and job["pid"] == first and len(job["attempts"]) == 1
    assert started_runs(starts, 1) == [(first, uuids[0])]


def test_failover_1_gives_up_after_one_move(fake_driver, tmp_path):
    uuids = three_cards(fake_driver)
    starts = tmp_path / "starts"
    run_job(fake_driver, "--gpu", "0", "--failover", "1", "--", *starts_script(starts))
    started_runs(starts, 1)
    set_card(fake_driver, 0, lost_after=0)
    (_, (second, given)) = started_runs(starts, 2)
    assert given == uuids[1]
    wait_for(lambda: the_job(fake_driver)["state"] == "running", what="running on card 1")
    set_card(fake_driver, 1, lost_after=0)
    job = wait_for(lambda: (job := the_job(fake_driver))["state"] == "killed" and job, what="the job to give up")
    assert job["reason"] == "GPU 1 is lost; not moved again: --failover 1 allows 1 move"
    assert [a["moved_because"] for a in job["attempts"]] == ["GPU 0 is lost", None]
    assert job["attempts"][1]["signal"] == "SIGTERM" and not psutil.pid_exists(second)
    time.sleep(1.5)  # card 2 is free, but the job has had its move
    assert len(started_runs(starts, 2)) == 2
    assert json.loads(fake_driver.run("snapshot", "--json").stdout)["gpus"][2]["processes"] == []


def test_an_error_exit_on_a_healthy_card_is_not_failed_over(fake_driver):
    three_cards(fake_driver)
    run_job(fake_driver, "--gpu", "0", "--failover", "2", "--", "sh", "-c", "sleep 0.5; exit 3")
    job = wait_for(lambda: (job := the_job(fake_driver))["state"] == "exited" and job, what="the job to end")
    assert job["exit_code"] == 3 and len(job["attempts"]) == 1
    assert job["reason"] == ("exited with status 3 on a healthy card: not failed over "
                             "(the program's error, not the card's)")


def test_without_failover_the_job_runs_on_and_its_record_says_the_card_failed(fake_driver, tmp_path):
    three_cards(fake_driver)
    go = tmp_path / "go"
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.05)\nraise SystemExit(1)"
    run_job(fake_driver, "--gpu", "0", "--", sys.executable, "-c", code)
    first = wait_for(lambda: the_job(fake_driver)["pid"], what="the job")
    set_card(fake_driver, 0, lost_after=0)
    time.sleep(1.5)
    job = the_job(fake_driver)
    assert job["state"] == "running" and job["pid"] == first and job["failover"] == 0  # as before: left alone
    go.touch()
    job = wait_for(lambda: (job := the_job(fake_driver))["state"] == "exited" and job, what="the job to end")
    assert job["exit_code"] == 1 and len(job["attempts"]) == 1
    assert job["reason"] == "GPU 0 is lost while the job ran (no --failover: it was not moved)"
    assert "=== gpumon" not in Path(job["log"]).read_text()  # logs of other jobs are as they were


def test_the_run_dialogs_failover_box_moves_the_job_and_J_shows_where_it_ran(fake_driver):
    uuids = three_cards(fake_driver)
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    app = create_app(backend, interval=0.2, backend_args={"nvml_lib": str(fake_driver.lib)})

    def the_job():
        return next(iter(records.list_jobs()), None)

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", *"sleep 600", *["tab"] * 6)
            assert isinstance(app.screen, RunDialog) and app.screen.focused.id == "run-failover"
            await pilot.press("space", "enter")
            await wait_until(pilot, lambda: the_job() and the_job().state == "running", what="the job")
            assert the_job().spec.failover == 3 and the_job().spec.gpus == [uuids[0]]
            set_card(fake_driver, 0, lost_after=0)
            await wait_until(pilot, lambda: len(the_job().attempts) == 2 and the_job().state == "running",
                             seconds=30, what="the job to move")
            await pilot.press("J")
            assert isinstance(app.screen, JobsScreen)
            await pilot.pause(0.3)
            detail = str(app.screen.query_one("#jobs-detail").render())
            assert "attempt 1: GPU 0," in detail and "moved: GPU 0 is lost" in detail
            assert "attempt 2: GPU 1, since" in detail

    try:
        run(go())
    finally:
        backend.close()


def test_a_launch_on_another_host_asks_for_the_same_failover():
    request = LaunchRequest(command=["python", "train.py"], gpu_spec="auto", failover=2)
    assert run_args(request) == ["--gpu", "auto", "--failover", "2", "--", "python", "train.py"]


def test_bad_failover_counts_are_one_line_and_exit_2(fake_driver):
    three_cards(fake_driver)
    for bad in ("-1", "two"):
        result = fake_driver.run("run", "--failover", bad, "--", "true")
        assert result.returncode == 2 and result.stderr.count("\n") == 1 and "--failover" in result.stderr


def event(job: str, attempt: int = 2) -> FailoverEvent:
    return FailoverEvent(host="h", job=job, name="train.py", from_gpus=(0,), from_uuids=("GPU-a",),
                         to_gpus=(1,), to_uuids=("GPU-b",), reason="GPU 0 is lost", attempt=attempt, time=1.0)


def test_the_event_log_is_followed_from_where_it_ended_across_rotation(monkeypatch):
    from gpumon.jobs.supervision import job_events

    append(event("before"))
    follower = EventFollower()
    assert follower.read_new() == []  # what was there before watch started is not news
    append(event("a"))
    with open(event_log(), "a") as f:
        f.write(json.dumps(event("b").to_dict())[:20])  # a line still being written
    assert [e.job for e in follower.read_new()] == ["a"]
    with open(event_log(), "a") as f:
        f.write(json.dumps(event("b").to_dict())[20:] + "\nnot json\n")
    assert [e.job for e in follower.read_new()] == ["b"]
    append(event("c"))
    size = job_events.ROTATE_BYTES
    monkeypatch.setattr(job_events, "ROTATE_BYTES", 10)
    append(event("d"))  # the log is rotated first: d starts a new file, c is left in the old one
    monkeypatch.setattr(job_events, "ROTATE_BYTES", size)
    assert event_log().with_name(event_log().name + ".1").exists()
    assert [e.job for e in follower.read_new()] == ["c", "d"]
    append(event("e"))
    assert [e.job for e in follower.read_new()] == ["e"]
