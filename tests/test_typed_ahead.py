"""Keys typed ahead of Enter, in a real terminal (tmux): a dialog that acts on Enter acts on
everything typed or pasted before it, however fast it arrives (text and Enter in one write)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest
from conftest import GIB, Card
from terminal import Tmux

from gpumon.cards.backends.demo import DemoBackend
from gpumon.jobs import control, records
from gpumon.jobs.launch import card_limits
from gpumon.sharing import claims
from gpumon.sharing.folder import SharingSettings

TRIES = 10
# No letter that is a key of the main screen: were Enter taken early, what follows it must not
# quit or open anything, so that the test reports what was launched.
TEXT = "echo {how}-{i}-0123456789.0123456789.0123456789/0123456789"


@pytest.fixture
def terminal(tmux_session):
    yield lambda: tmux_session(120, 40)
    for job in records.list_jobs():  # a failed test may leave a job behind
        if job.state in ("running", "queued"):
            control.stop(job)


def start_gpumon(tmux: Tmux, *args: str) -> None:
    # GPUMON_CLAIMS_DIR: the test's own place for claims, not the machine's /tmp/gpumon-claims.
    keep = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME", "TZ", "GPUMON_CLAIMS_DIR")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in os.environ.items() if k in keep)
    tmux.start(f"env -i {env} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon "
               f"{shlex.join(args)}; sleep 600")


def type_then_enter(tmux: Tmux, text: str) -> None:
    """The text and Enter in one write, as a fast typist or a terminal's "send line" gives them."""
    tmux("send-keys", "-t", "t", "-l", text, ";", "send-keys", "-t", "t", "Enter")


def paste_then_enter(tmux: Tmux, text: str) -> None:
    """A bracketed paste (the app asked for them) and Enter right behind it."""
    tmux("set-buffer", "-b", "typed", text, ";", "paste-buffer", "-p", "-d", "-b", "typed", "-t", "t",
         ";", "send-keys", "-t", "t", "Enter")


def wait_until_no_card_is_claimed() -> None:
    """The last job launched holds its card until its supervisor ends; `r` on a claimed card asks
    first (sharing it), and this test is about the run dialog: the next try waits for a free card."""
    place = SharingSettings().directory
    deadline = time.monotonic() + 30
    while claims.read(place):
        assert time.monotonic() < deadline, f"a card is still claimed: {claims.read(place)}"
        time.sleep(0.1)


def launched_commands(count: int) -> list[str]:
    """The commands of the jobs launched, as `gpumon jobs --json` lists them, once there are `count`."""
    deadline = time.monotonic() + 30
    while True:
        out = subprocess.run([sys.executable, "-m", "gpumon", "jobs", "--json"], capture_output=True,
                             text=True, timeout=30, check=True).stdout
        commands = [job["command"][-1] for job in json.loads(out)]
        if len(commands) >= count or time.monotonic() > deadline:
            return sorted(commands)
        time.sleep(0.2)


@pytest.mark.parametrize("send", [type_then_enter, paste_then_enter], ids=["typed", "pasted"])
def test_enter_in_the_run_dialog_launches_everything_typed_before_it(terminal, send):
    tmux = terminal()
    start_gpumon(tmux, "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "A100" in s and "python train.py" in s, what="the dashboard")
    typed = [TEXT.format(how=send.__name__, i=i) for i in range(TRIES)]
    for count, text in enumerate(typed, 1):
        tmux.keys("r")
        tmux.wait_for(lambda s: "Run on GPU" in s, what="the run dialog")
        send(tmux, text)
        tmux.wait_for(lambda s: "Run on GPU" not in s, what="the dialog to close")
        # The launch goes on after the dialog closes: once its job is recorded, its claim is taken
        # (or already let go), and the next `r` waits for the card to be free again.
        launched_commands(count)
        wait_until_no_card_is_claimed()
    assert launched_commands(TRIES) == sorted(typed)


def test_enter_in_the_fleet_run_dialog_launches_everything_typed_before_it(terminal):
    tmux = terminal()
    start_gpumon(tmux, "--hosts", "local", "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "local" in s and "live" in s, what="the fleet")
    typed = [TEXT.format(how="fleet", i=i) for i in range(TRIES // 2)]
    for count, text in enumerate(typed, 1):
        tmux.keys("r")
        tmux.wait_for(lambda s: "Run on local:" in s, what="the run dialog")
        send = type_then_enter if len(text) % 2 else paste_then_enter
        send(tmux, text)
        tmux.wait_for(lambda s: "Run on local:" not in s, what="the dialog to close")
        # `r` on a host offers only a card nobody claims: the next try waits for the last job's to go.
        launched_commands(count)
        wait_until_no_card_is_claimed()
    assert launched_commands(len(typed)) == sorted(typed)


def test_editing_keys_and_tab_in_the_run_dialog_act_in_the_order_typed(terminal, tmp_path):
    """Backspace, Ctrl-U and Tab arrive with the characters around them: each acts where it was typed."""
    (tmp_path / "there").mkdir()
    tmux = terminal()
    start_gpumon(tmux, "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "A100" in s and "python train.py" in s, what="the dashboard")
    tmux.keys("r")
    tmux.wait_for(lambda s: "Run on GPU" in s, what="the run dialog")
    tmux("send-keys", "-t", "t", "-l", "echo 1234", ";", "send-keys", "-t", "t", "BSpace", "BSpace", ";",
         "send-keys", "-t", "t", "-l", "56", ";", "send-keys", "-t", "t", "Tab", "C-u", ";",
         "send-keys", "-t", "t", "-l", str(tmp_path / "there"), ";", "send-keys", "-t", "t", "Enter")
    tmux.wait_for(lambda s: "Run on GPU" not in s, what="the dialog to close")
    (command,) = launched_commands(1)
    assert command == "echo 1256"
    (job,) = records.list_jobs()
    assert job.spec.cwd == str(tmp_path / "there")


def test_enter_in_the_memory_limit_dialog_saves_everything_typed_before_it(terminal):
    tmux = terminal()
    start_gpumon(tmux, "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "A100" in s and "python train.py" in s, what="the dashboard")
    uuid = DemoBackend().sample().gpus[0].uuid
    for size in ("12345678901", "23456789012", "34567890123"):
        tmux.keys("m")
        tmux.wait_for(lambda s: "Memory limit for jobs on GPU 0" in s, what="the memory limit dialog")
        tmux("send-keys", "-t", "t", "C-u", ";", "send-keys", "-t", "t", "-l", size, ";",
             "send-keys", "-t", "t", "Enter")
        tmux.wait_for(lambda s: "jobs launched here are capped" in s, what="the limit saved")
        assert card_limits().get(uuid) == int(size)
        tmux.wait_for(lambda s: "jobs launched here are capped" not in s, timeout=30, what="the notice to go")


def test_enter_in_the_filter_applies_everything_typed_before_it(terminal):
    tmux = terminal()
    start_gpumon(tmux, "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "52904" in s and "48213" in s, what="the processes")
    tmux.keys("/")
    tmux.wait_for(lambda s: "filter" in s.lower(), what="the filter box")
    type_then_enter(tmux, "52904")
    # Everything typed filters, and the keys after Enter go to the table, not to the box.
    screen = tmux.wait_for(lambda s: "48213" not in s and "52904" in s, what="the filter applied")
    tmux.keys("j")
    time.sleep(0.5)
    assert "52904j" not in tmux.screen(), screen


def test_tab_and_enter_together_in_a_confirmation_press_the_button_tab_moved_to(terminal, fake_driver,
                                                                                idle_processes):
    proc = idle_processes()
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=GIB)]
    fake_driver.write()
    tmux = terminal()
    keep = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "TZ", "GPUMON_NVML_LIB", "FAKE_NVML_CONFIG")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items() if k in keep)
    tmux.start(f"env -i {env} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon "
               f"--interval 0.5; sleep 600")
    tmux.wait_for(lambda s: str(proc.pid) in s, what="the process")
    tmux.keys("Tab", "x")
    tmux.wait_for(lambda s: f"Send SIGTERM to process {proc.pid}?" in s, what="the confirmation")
    # No has the focus: Tab moves it to Yes, and the Enter right behind it presses Yes.
    tmux("send-keys", "-t", "t", "Tab", "Enter")
    assert proc.wait(20) == -signal.SIGTERM
