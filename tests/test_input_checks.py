"""Input that cannot be right is refused in its own words, through the real program: alert rules
naming cards that do not exist, memory limits above the card's memory or below zero, unknown demo
scenarios, job ids given by a part of them; and what is allowed but worth a word: a busy card
chosen by hand. Also: a job is named after the program it runs, not after inline code."""

from __future__ import annotations

import getpass
import json
import os
import shlex
import subprocess
import sys
import time

import pytest
from conftest import GIB, Card

from gpumon.jobs import control, files, records


def assert_one_line_error(result: subprocess.CompletedProcess[str], *words: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def eight_cards(fake_driver, busy_pid: int | None = None) -> None:
    """An 8-card 80G machine; card 0 97 % busy with 69G taken (by `busy_pid`, when given)."""
    fake_driver.machine.cards = [
        Card("NVIDIA A100-SXM4-80GB", mem_total=80 * GIB,
             extra=dict(util=97, mem_used=69 * GIB) if i == 0 else dict(util=0, mem_used=GIB // 2))
        for i in range(8)
    ]
    if busy_pid is not None:
        fake_driver.machine.procs = [dict(gpu=0, pid=busy_pid, mem=68 * GIB, sm=97)]
    fake_driver.write()


def wait_for(predicate, timeout: float = 30.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def stop_jobs():
    """Jobs a test started are stopped when it ends, even when it failed half-way."""
    yield
    for job in records.list_jobs():
        if job.state in ("running", "queued"):
            control.stop(job)


# -- alert rules on cards that do not exist ------------------------------------------------------

def test_watch_refuses_a_rule_on_a_card_that_does_not_exist(fake_driver, tmp_path):
    eight_cards(fake_driver)
    line = assert_one_line_error(fake_driver.run("watch", "--interval", "0.2", "--count", "3",
                                                 "--alert", "temp > 85 on 12"), "on 12", "GPU 12", "0-7")
    assert "alert rule" in line
    # The config's rules too, and every missing card is named.
    config = tmp_path / "config.toml"
    config.write_text('[watch]\nrules = ["util > 50 on 3,9,10"]\n')
    assert_one_line_error(fake_driver.run("watch", "--config", str(config), "--interval", "0.2", "--count", "3"),
                          "GPUs 9, 10", "0-7")
    # A card that exists is fine.
    fine = fake_driver.run("watch", "--interval", "0.2", "--count", "2", "--alert", "util > 50 on 0,7")
    assert fine.returncode == 0 and fine.stderr == "", fine.stderr
    assert json.loads(fine.stdout.splitlines()[0])["gpu"] == 0


def _tui_in_tmux(tmux_session, fake_driver, tmp_path, *args: str):
    """gpumon's TUI in tmux; returns (session, exit status file). (Textual draws on stderr: what
    gpumon says when it leaves is read off the screen.)"""
    status = tmp_path / "status"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items()
                   if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME",
                            "XDG_STATE_HOME", "TZ"))
    tmux = tmux_session(120, 40)
    tmux.start(f"clear; env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon {shlex.join(args)}; "
               f"echo $? > {status}; sleep 60")
    return tmux, status


def _refused(tmux, status) -> str:
    """The one line gpumon left with (exit status 2), read off the screen it restored."""
    wait_for(lambda: status.exists() and status.read_text().strip(), what="gpumon to exit")
    screen = tmux.screen()
    assert status.read_text().strip() == "2", screen
    lines = [line for line in screen.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpumon: error: "), screen
    return lines[0]


@pytest.mark.parametrize("args, words", [
    # The driver names its cards before the TUI starts: refused then.
    (["--alert", "temp > 85 on 12"], ["GPU 12", "0-7"]),
    # The demo's cards are known from its first sample: the TUI leaves and says why.
    (["--demo", "--alert", "temp > 85 on 9"], ["GPU 9", "0-3"]),
], ids=["driver", "demo"])
def test_the_tui_refuses_a_rule_on_a_card_that_does_not_exist(fake_driver, tmux_session, tmp_path, args, words):
    eight_cards(fake_driver)
    tmux, status = _tui_in_tmux(tmux_session, fake_driver, tmp_path, "--interval", "0.3", *args)
    line = _refused(tmux, status)
    assert all(word in line for word in words), line


def test_the_tui_refuses_a_config_rule_on_a_card_that_does_not_exist(fake_driver, tmux_session, tmp_path):
    eight_cards(fake_driver)
    config = tmp_path / "config.toml"
    config.write_text('rules = ["temp > 85 on 8"]\n')
    tmux, status = _tui_in_tmux(tmux_session, fake_driver, tmp_path, "--config", str(config))
    assert "GPU 8" in _refused(tmux, status)


def test_a_fleet_warns_per_host_that_lacks_a_rules_card(ssh_lab):
    ssh_lab.host("big").machine.cards = [Card(extra=dict(temp=40)) for _ in range(3)] + [Card(extra=dict(temp=91))]
    ssh_lab.host("small").machine.cards = [Card(extra=dict(temp=40))]
    for host in ssh_lab.hosts.values():
        host.write()
    watched = subprocess.run(ssh_lab.gpumon_argv("watch", "--hosts", "big,small", "--alert", "temp > 80 on 3",
                                                 "--interval", "0.3", "--count", "10"),
                             env=ssh_lab.env(), capture_output=True, text=True, timeout=90)
    assert watched.returncode == 0, watched.stderr
    warnings = [line for line in watched.stderr.splitlines() if "GPU 3" in line]
    assert len(warnings) == 1 and "small" in warnings[0] and "big" not in warnings[0], watched.stderr
    fired = [json.loads(line) for line in watched.stdout.splitlines()]
    assert [(e["host"], e["gpu"], e["event"]) for e in fired] == [("big", 3, "firing")]


# -- memory limits -------------------------------------------------------------------------------

def test_run_refuses_a_memory_limit_above_the_cards_memory(fake_driver):
    eight_cards(fake_driver)
    assert_one_line_error(fake_driver.run("run", "--gpu", "3", "--mem-limit", "200G", "--", "true"),
                          "200G", "GPU 3", "80G")
    assert_one_line_error(fake_driver.run("run", "--wait", "--mem-limit", "81G", "--", "true"), "81G", "80G")
    assert records.list_jobs() == []


@pytest.mark.parametrize("args", [["--mem-limit", "-5G"], ["--mem-limit=-5G"]])
def test_a_negative_memory_limit_is_a_bad_size(fake_driver, args):
    eight_cards(fake_driver)
    line = assert_one_line_error(fake_driver.run("run", "--gpu", "3", *args, "--", "true"), "bad size '-5G'")
    assert "expected one argument" not in line
    assert records.list_jobs() == []


def _type(tmux, text: str) -> None:
    """Typed as a person would: keys sent with what follows in one burst can be taken for a paste."""
    tmux("send-keys", "-t", "t", "-l", text)
    # Its end: a long path (a pytest-xdist worker's temporary folder) scrolls the field's start away.
    tmux.wait_for(lambda s: text[-60:] in s, what=f"{text!r} on screen")
    time.sleep(0.3)


def test_the_dialogs_refuse_a_memory_limit_above_the_cards_memory(fake_driver, tmux_session, tmp_path):
    eight_cards(fake_driver)
    tmux, status = _tui_in_tmux(tmux_session, fake_driver, tmp_path, "--interval", "0.5")
    tmux.wait_for(lambda s: "A100" in s and "97%" in s, what="the dashboard")
    tmux.keys("j")  # card 1: idle, so the run dialog has nothing else to say
    tmux.keys("m")
    tmux.wait_for(lambda s: "Memory limit for jobs on GPU 1" in s, what="the m dialog")
    _type(tmux, "200G")
    tmux.keys("Enter")
    screen = tmux.wait_for(lambda s: "more than the card's memory" in s, what="m's refusal")
    assert "Memory limit for jobs on GPU 1" in screen and "80G" in screen, "the dialog stays, saying why"
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "Memory limit for jobs" not in s, what="the m dialog to close")

    tmux.keys("r")
    tmux.wait_for(lambda s: "Run on GPU 1" in s, what="the run dialog")
    _type(tmux, "true")
    tmux.keys("Tab", "Tab")
    _type(tmux, "200G")
    tmux.keys("Enter")
    screen = tmux.wait_for(lambda s: "more than the card's memory" in s, what="r's refusal")
    assert "Run on GPU 1" in screen
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "Run on GPU" not in s, what="the run dialog to close")
    tmux.keys("q")
    wait_for(lambda: status.exists(), what="gpumon to quit")
    assert records.list_jobs() == []
    assert not (files.state_dir() / "card-limits.json").exists(), "nothing was saved"


# -- the demo's scenarios ------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["--demo", "bogus"], ["--demo", "bogus", "snapshot"], ["--demo=bogus"],
                                  ["snapshot", "--demo", "bogus"]])
def test_an_unknown_demo_scenario_is_named_with_the_known_ones(fake_driver, args):
    line = assert_one_line_error(fake_driver.run(*args), "'bogus'", "default", "workstation", "hot", "lost")
    assert "scenario" in line and "invalid choice" not in line and "COMMAND" not in line


def test_demo_and_a_scenario_still_come_before_a_command(fake_driver):
    assert fake_driver.run("--demo", "snapshot").returncode == 0
    assert fake_driver.run("--demo", "hot", "snapshot").returncode == 0


# -- a busy card chosen by hand ------------------------------------------------------------------

def test_run_on_a_busy_card_says_so_and_starts(fake_driver, idle_processes, stop_jobs):
    holder = idle_processes()
    eight_cards(fake_driver, busy_pid=holder.pid)
    result = fake_driver.run("run", "--interval", "0.2", "--gpu", "0", "--", "true")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for words in ("GPU 0 is busy", "97%", "69G of 80G", str(holder.pid), getpass.getuser()):
        assert words in lines[0], (words, lines[0])
    assert "job " in result.stdout and len(records.list_jobs()) == 1, "it still starts: the user chose the card"
    # An idle card, or one auto chose: not a word.
    for gpu in ("1", "auto"):
        quiet = fake_driver.run("run", "--interval", "0.2", "--gpu", gpu, "--", "true")
        assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_the_run_dialog_says_the_card_is_busy_before_enter(fake_driver, idle_processes, tmux_session, tmp_path,
                                                           stop_jobs):
    holder = idle_processes()
    eight_cards(fake_driver, busy_pid=holder.pid)
    tmux, status = _tui_in_tmux(tmux_session, fake_driver, tmp_path, "--interval", "0.5")
    tmux.wait_for(lambda s: "A100" in s and str(holder.pid) in s, what="the dashboard with the busy card's process")
    tmux.keys("r")
    screen = tmux.wait_for(lambda s: "Run on GPU 0" in s, what="the run dialog")
    assert "GPU 0 is busy" in screen and "97%" in screen and str(holder.pid) in screen, screen
    out = tmp_path / "ran"
    _type(tmux, f"touch {out}")
    tmux.keys("Enter")
    wait_for(out.exists, what="the job, launched anyway")

    # An idle card's dialog says nothing of the kind.
    tmux.wait_for(lambda s: "Run on GPU" not in s, what="the dialog to close")
    tmux.keys("j", "r")
    screen = tmux.wait_for(lambda s: "Run on GPU 1" in s, what="the run dialog on card 1")
    assert "busy" not in screen, screen
    tmux.keys("Escape", "q")


# -- job names -----------------------------------------------------------------------------------

def test_a_job_is_named_after_its_program_not_inline_code(fake_driver, tmp_path, stop_jobs):
    eight_cards(fake_driver)
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    cases = [
        (["sh", "-c", "env | grep CUDA"], "sh"),
        ([sys.executable, "-c", "import os; print(os.getpid())"], os.path.basename(sys.executable)),
        ([sys.executable, str(script)], "train.py"),
        (["--name", "mine", "--", "sh", "-c", "env | grep CUDA"], "mine"),
    ]
    for argv, _ in cases:
        options = [] if argv[0] == "--name" else ["--"]
        result = fake_driver.run("run", "--interval", "0.2", "--gpu", "1", *options, *argv)
        assert result.returncode == 0, result.stderr
    names = [job["name"] for job in json.loads(fake_driver.run("jobs", "--json").stdout)]
    assert names == [name for _, name in cases]


# -- job ids by a part of them -------------------------------------------------------------------

def test_a_job_is_found_by_any_unique_part_of_its_id(fake_driver, stop_jobs):
    eight_cards(fake_driver)
    for word in ("first", "second"):
        assert fake_driver.run("run", "--interval", "0.2", "--gpu", "1", "--", "echo", word).returncode == 0
    first, second = (job.spec.id for job in records.list_jobs())
    wait_for(lambda: all(j.state == "exited" for j in records.list_jobs()), what="both jobs to end")
    for part in (first[-4:], first[-11:]):  # `591e`, `140412-591e`
        shown = fake_driver.run("jobs", "--log", part)
        assert shown.returncode == 0 and shown.stdout.strip() == "first", (part, shown.stderr)
    common = os.path.commonprefix([first, second])
    line = assert_one_line_error(fake_driver.run("jobs", "--log", common), first, second, "2 jobs")
    assert "(echo)" in line
    assert_one_line_error(fake_driver.run("jobs", "--log", "zzzz"), "no job 'zzzz'")

    started = fake_driver.run("run", "--interval", "0.2", "--gpu", "1", "--", "sleep", "60")
    assert started.returncode == 0, started.stderr
    running = records.list_jobs()[-1]
    stopped = fake_driver.run("jobs", "--stop", running.spec.id[-4:])
    assert stopped.returncode == 0 and running.spec.id in stopped.stdout, stopped.stderr
    wait_for(lambda: records.load_job(running.dir).state not in ("running", "queued"), what="the job to stop")
