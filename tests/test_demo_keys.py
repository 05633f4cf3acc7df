"""In --demo (and --replay) the processes are not real: the keys that act on a process say why
they cannot, and `r`'s dialog says that the job it launches is real. In a real terminal (tmux)."""

from __future__ import annotations

import os
import shlex
import sys

from gpumon.cards.backends.demo import DemoBackend
from gpumon.cards.recording import Recorder


def start(tmux, *args: str) -> None:
    keep = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
            "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG", "XDG_DATA_HOME", "TZ")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in os.environ.items() if k in keep)
    tmux.start(f"env -i {env} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon "
               f"{shlex.join(args)}; sleep 600")


def joined(screen: str) -> str:
    """The screen's text with a toast's wrapped lines put back together."""
    return " ".join(" ".join(line.replace("▌", " ").replace("│", " ").split()) for line in screen.splitlines())


def test_keys_on_a_simulated_process_say_why_they_do_nothing(tmux_session):
    tmux = tmux_session(100, 30)
    start(tmux, "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "48213" in s, what="the demo's processes")
    tmux.keys("Tab")  # the process table, its first row selected
    tmux.keys("x")
    tmux.wait_for(lambda s: "--demo: process 48213 is simulated, nothing to signal" in joined(s),
                  what="why x does nothing")
    tmux.keys("e")
    tmux.wait_for(lambda s: "--demo: process 48213 is simulated, no environment to show" in joined(s),
                  what="why e does nothing")
    screen = tmux.screen()
    assert "Send SIGTERM" not in screen and "Environment of" not in screen


def test_r_in_the_demo_says_the_job_is_real(tmux_session):
    tmux = tmux_session(80, 24)
    start(tmux, "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "A100" in s, what="the dashboard")
    tmux.keys("r")
    screen = tmux.wait_for(lambda s: "Run on GPU 0" in s, what="the run dialog")
    assert "Simulated card (--demo), real job: it runs here and CUDA sees no GPU." in screen
    tmux.keys("Escape")


def test_keys_on_a_recorded_process_say_why_they_do_nothing(tmux_session, tmp_path):
    recording = tmp_path / "rec.jsonl"
    recorder, demo = Recorder(str(recording)), DemoBackend()
    for _ in range(30):
        recorder.write(demo.sample())
    recorder.close()
    tmux = tmux_session(100, 30)
    start(tmux, "--replay", str(recording))
    tmux.wait_for(lambda s: "48213" in s, what="the recorded processes")
    tmux.keys("Tab", "X")
    tmux.wait_for(lambda s: "--replay: process 48213 was recorded, nothing to signal" in joined(s),
                  what="why X does nothing")
