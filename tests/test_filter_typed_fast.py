"""A filter typed fast, in a real terminal (tmux): every key after `/` goes into the filter box, in the
order typed, however fast it comes (`/zqxw` in one write); none reaches the screen's own bindings
(`q` quits, `x` asks to terminate a process) or a dialog that is not built yet."""

from __future__ import annotations

import os
import shlex
import signal
import sys

import pytest
from conftest import GIB, Card
from terminal import Tmux

TYPED = "zqxw"  # q quits, x terminates the selected process: as filter text both are just letters


def start(tmux: Tmux, status, *args: str, env: dict[str, str] | None = None) -> None:
    """gpumon ARGS in the terminal; its exit status is written to `status` when it ends."""
    env = os.environ if env is None else env
    keep = ("PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
            "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG", "XDG_DATA_HOME", "TZ", "GPUMON_NVML_LIB",
            "FAKE_NVML_CONFIG")
    passed = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k in keep)
    tmux.start(f"env -i {passed} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon "
               f"{shlex.join(args)}; echo $? > {shlex.quote(str(status))}; sleep 600")


def type_fast(tmux: Tmux, text: str) -> None:
    """`/` and the text in one write, as a fast typist or a paste-like burst over ssh gives them."""
    tmux("send-keys", "-t", "t", "-l", "/" + text)


def still_running(tmux: Tmux, status, screen: str) -> None:
    assert not status.exists(), f"gpumon ended with status {status.read_text().strip()}:\n{screen}"


@pytest.fixture
def terminal(tmux_session):
    return lambda: tmux_session(120, 40)


def test_a_filter_typed_fast_on_the_demo_stays_open_and_filters(terminal, tmp_path):
    tmux, status = terminal(), tmp_path / "status"
    start(tmux, status, "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "A100" in s and "python train.py" in s, what="the dashboard")
    type_fast(tmux, TYPED)
    screen = tmux.wait_for(lambda s: f"filter “{TYPED}”" in s or status.exists(), what="the filter applied")
    still_running(tmux, status, screen)
    assert "python train.py" not in screen, "the filter matches no process"


def one_process(fake_driver, idle_processes, tmux: Tmux, status):
    """gpumon on the fake driver, listing one real process, the process table focused (where `x`
    terminates the selected process)."""
    proc = idle_processes()
    fake_driver.machine.cards = [Card("NVIDIA A10", mem_total=24 * GIB)]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=GIB)]
    fake_driver.write()
    start(tmux, status, "--interval", "0.5", env=fake_driver.env)
    tmux.wait_for(lambda s: str(proc.pid) in s, what="the process")
    tmux.keys("Tab")
    return proc


def test_a_filter_typed_fast_over_real_processes_asks_nothing(terminal, tmp_path, fake_driver, idle_processes):
    tmux, status = terminal(), tmp_path / "status"
    proc = one_process(fake_driver, idle_processes, tmux, status)
    type_fast(tmux, TYPED)
    screen = tmux.wait_for(lambda s: f"filter “{TYPED}”" in s or status.exists(), what="the filter applied")
    still_running(tmux, status, screen)
    assert "SIGTERM" not in screen and proc.poll() is None
    tmux.keys("Escape")  # the filter cleared: the process is listed again, and gpumon still runs
    screen = tmux.wait_for(lambda s: str(proc.pid) in s or status.exists(), what="the process again")
    still_running(tmux, status, screen)


def test_a_key_typed_right_after_x_reaches_the_dialog_once_it_is_built(terminal, tmp_path, fake_driver,
                                                                        idle_processes):
    """`x` opens the confirmation; the `y` in the same write waits for it to be built, then answers."""
    tmux, status = terminal(), tmp_path / "status"
    proc = one_process(fake_driver, idle_processes, tmux, status)
    tmux("send-keys", "-t", "t", "-l", "xy")
    assert proc.wait(20) == -signal.SIGTERM
    screen = tmux.wait_for(lambda s: "SIGTERM" not in s, what="the dialog to close")
    still_running(tmux, status, screen)


def test_a_filter_typed_fast_on_the_fleet_filters_the_hosts(terminal, tmp_path):
    tmux, status = terminal(), tmp_path / "status"
    start(tmux, status, "--hosts", "local", "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: "local" in s and "live" in s, what="the fleet")
    type_fast(tmux, TYPED)
    screen = tmux.wait_for(lambda s: f"0 match “{TYPED}”" in s or status.exists(), what="the filter applied")
    still_running(tmux, status, screen)


@pytest.mark.parametrize("fleet", [False, True], ids=["here", "fleet"])
def test_a_filter_typed_fast_in_the_users_view_filters_the_holders(terminal, tmp_path, fleet):
    tmux, status = terminal(), tmp_path / "status"
    start(tmux, status, *(["--hosts", "local"] if fleet else []), "--demo", "--interval", "0.5")
    tmux.wait_for(lambda s: ("live" if fleet else "python train.py") in s, what="gpumon")
    tmux.keys("u")
    tmux.wait_for(lambda s: "rows" in s and "filter" in s, what="the users view")
    type_fast(tmux, TYPED)
    screen = tmux.wait_for(lambda s: f"filter “{TYPED}”" in s or status.exists(), what="the filter applied")
    still_running(tmux, status, screen)
