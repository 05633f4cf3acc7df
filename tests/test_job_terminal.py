"""Jobs in a real terminal (tmux): Ctrl-C on a foreground job, from `gpumon run --foreground` and
from the TUI's suspend-and-run path, and the environment a job launched from the TUI gets."""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

import pytest
from conftest import GIB, Card
from terminal import Tmux

from gpumon.jobs import control, records

READY = "echo job-is-ready; exec sleep 60"


@pytest.fixture
def terminal(tmux_session):
    yield lambda width=120, height=40: tmux_session(width, height)
    for job in records.list_jobs():  # a failed test may leave its job behind
        if job.state in ("running", "queued"):
            control.stop(job)


def machine(fake_driver) -> None:
    fake_driver.machine.cards = [Card("NVIDIA L4", mem_total=24 * GIB, extra=dict(cpus="0")) for _ in range(2)]
    fake_driver.write()


def start_env(fake_driver, **extra: str) -> dict[str, str]:
    """Exactly the environment gpumon starts with (`env -i`), so a test can tell what it added."""
    keep = ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
            "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG", "TZ")
    # LANG: without a locale, Python itself would add LC_CTYPE (PEP 538) before gpumon runs.
    env = {k: v for k, v in fake_driver.env.items() if k in keep}
    return env | {"TERM": "xterm-256color", "LANG": "C.UTF-8"} | extra


def shell_line(env: dict[str, str], *argv: str, status: Path) -> str:
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return f"env -i {assignments} {shlex.join(argv)}; echo gpumon-exit=$? > {status}; sleep 60"


def type_into_dialog(tmux: Tmux, text: str) -> None:
    """Type, then wait until it is on screen: keys sent in one burst with what follows can be
    taken for a paste (Enter and Tab included)."""
    tmux("send-keys", "-t", "t", "-l", text)
    tmux.wait_for(lambda s: text[-30:] in s, what="the typed command in the dialog")
    time.sleep(0.3)


def job_is_ready(screen: str) -> bool:
    """The job's own line: not gpumon's echo of the command line, which holds the same words."""
    return any(line.strip() == "job-is-ready" for line in screen.splitlines())


def the_job() -> records.Job:
    for _ in range(300):
        listed = records.list_jobs()
        if listed and listed[0].state not in ("running", "queued"):
            return listed[0]
        time.sleep(0.1)
    raise AssertionError(f"the job did not end: {records.list_jobs()}")


def test_ctrl_c_on_a_foreground_run_is_recorded(fake_driver, terminal, tmp_path):
    machine(fake_driver)
    status = tmp_path / "status"
    tmux = terminal()
    tmux.start(shell_line(start_env(fake_driver), sys.executable, "-m", "gpumon", "run", "--interval", "0.2",
                          "--gpu", "1", "--foreground", "--", "sh", "-c", READY, status=status))
    tmux.wait_for(job_is_ready, what="the job to start")
    tmux.keys("C-c")
    for _ in range(300):
        if status.exists():
            break
        time.sleep(0.1)
    assert status.read_text().strip() == "gpumon-exit=130"
    screen = tmux.screen()
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen, screen
    job = the_job()
    assert (job.state, job.signal, job.exit_code) == ("killed", "SIGINT", None), job.reason


def test_ctrl_c_on_a_foreground_job_from_the_tui_is_recorded(fake_driver, terminal, tmp_path):
    machine(fake_driver)
    status = tmp_path / "status"
    tmux = terminal()
    tmux.start(shell_line(start_env(fake_driver), sys.executable, "-m", "gpumon", "--interval", "0.5",
                          status=status))
    # A reading, not only the cards' names: before the first one, r says "select a working card first".
    tmux.wait_for(lambda s: "L4" in s and "UTIL" in s and "%" in s, what="the dashboard's first reading")
    tmux.keys("r")
    tmux.wait_for(lambda s: "Run on GPU 0" in s, what="the run dialog")
    type_into_dialog(tmux, READY)
    tmux.keys("Tab", "Tab", "Tab", "Tab", "Space", "BTab", "BTab", "BTab", "BTab", "Enter")  # Foreground
    tmux.wait_for(job_is_ready, what="the job in the terminal")
    # A moment later, as a person would: a key sent while the TUI hands the terminal over can
    # still arrive in the keyboard mode Textual had asked the terminal for.
    time.sleep(1.0)
    tmux.keys("C-c")
    screen = tmux.wait_for(lambda s: "Press Enter to return" in s, what="the job's end")
    assert "SIGINT" in screen and "Traceback" not in screen, screen
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "L4" in s and "Run on GPU" not in s, what="the dashboard again")
    assert not status.exists(), "gpumon must survive the job's Ctrl-C"
    job = the_job()
    assert (job.state, job.signal) == ("killed", "SIGINT"), job.reason
    tmux.keys("q")


def test_a_job_from_the_tui_gets_the_environment_gpumon_started_with(fake_driver, terminal, tmp_path):
    machine(fake_driver)
    status = tmp_path / "status"
    out = tmp_path / "job-env.json"
    env = start_env(fake_driver, COLUMNS="77", LINES="19", MY_SETTING="kept")
    tmux = terminal()
    tmux.start(shell_line(env, sys.executable, "-m", "gpumon", "--no-color", "--interval", "0.5", status=status))
    # A reading, not only the cards' names: before the first one, r says "select a working card first".
    tmux.wait_for(lambda s: "L4" in s and "UTIL" in s and "%" in s, what="the dashboard's first reading")
    tmux.keys("r")
    tmux.wait_for(lambda s: "Run on GPU 0" in s, what="the run dialog")
    dump = f"{shlex.quote(sys.executable)} -c 'import json, os; print(json.dumps(dict(os.environ)))' > {out}"
    type_into_dialog(tmux, dump)
    tmux.keys("Enter")
    for _ in range(300):
        if out.exists() and out.stat().st_size:
            break
        time.sleep(0.1)
    seen = json.loads(out.read_text())
    tmux.keys("q")
    added = set(seen) - set(env)
    # What the job adds: its pinning, and what the shell sets for itself; nothing gpumon set for itself.
    assert added <= {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUMON_JOB_ID", "PWD", "SHLVL", "_"}, added
    assert "NO_COLOR" not in seen
    assert {k: seen.get(k) for k in ("COLUMNS", "LINES", "MY_SETTING")} == {
        "COLUMNS": "77", "LINES": "19", "MY_SETTING": "kept"}
