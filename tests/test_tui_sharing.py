"""The TUI on a shared host, through tmux: a reserved card says so on its panel; `r` on a card
another job claims asks first and says who holds it; J lists the host's queue."""

from __future__ import annotations

import shlex
import sys

from conftest import GIB, Card
from test_claims import jobs


def test_claims_reservations_and_queue_in_the_tui(fake_driver, tmux_session):
    fake_driver.machine.cards = [
        Card("NVIDIA A40", uuid=f"GPU-{i}{i}{i}{i}9999-1111-2222-3333-44445555666{i}",
             bus=f"00000000:{0x71 + i:02X}:00.0", mem_total=48 * GIB,
             extra=dict(mem_used=(40 if i == 0 else 1) * GIB, util=90 if i == 0 else 0))
        for i in range(3)]
    fake_driver.write()
    try:
        assert fake_driver.run("reserve", "--gpu", "2", "--for", "1h", "--note", "[b]paper[/b]").returncode == 0
        assert fake_driver.run("run", "--gpu", "1", "--name", "[red]train[/red]", "--", "sleep", "60").returncode == 0
        assert fake_driver.run("run", "--wait", "--gpu", "0", "--name", "later", "--", "true").returncode == 0
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items()
                       if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME",
                                "XDG_STATE_HOME", "TZ", "GPUMON_CLAIMS_DIR"))
        tmux = tmux_session(120, 40)
        tmux.start(f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --interval 0.5")
        screen = tmux.wait_for(lambda s: "Reserved by root until" in s, what="the reservation on its card")
        assert 'Reserved by root until' in screen and '"[b]paper[/b]"' in screen

        tmux.keys("Down", "r")  # card 1: claimed by the job started above
        screen = tmux.wait_for(lambda s: "Run a job there anyway?" in s, what="the question")
        assert "GPU 1 is claimed by root: job " in screen and "[red]train[/red]" in screen
        tmux.keys("y")
        screen = tmux.wait_for(lambda s: "Run on GPU 1" in s, what="the run dialog")
        assert "job will share it." in screen and "is claimed by root" in screen
        tmux.keys("Escape")  # alone: ESC then J at once reads as Alt+J
        tmux.wait_for(lambda s: "Run on GPU 1" not in s, what="the dialog to close")
        tmux.keys("J")
        screen = tmux.wait_for(lambda s: "Queue on this host" in s, what="the queue under J")
        assert "1. root: job " in screen and "later wants 0" in screen
    finally:
        for job in jobs(fake_driver):
            if job["state"] in ("running", "queued"):
                fake_driver.run("jobs", "--stop", job["id"])
