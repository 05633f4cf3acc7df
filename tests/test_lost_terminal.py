"""A TUI whose terminal goes away ends, and SIGTERM always ends it, releasing the usage ledger's
lock: a real user's `su -l USER -c gpumon` in tmux (su puts gpumon in a session of its own, with no
controlling terminal, so closing the terminal sends it no SIGHUP), over the fake driver."""

from __future__ import annotations

import fcntl
import os
import pty
import pwd
import secrets
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from fcntl import ioctl
from pathlib import Path
from termios import TIOCSWINSZ

import psutil
import pytest
from conftest import Card, add_suite_user, end_users_processes, require_tool
from terminal import Tmux

from gpumon.usage.settings import default_path

# Other users cannot run a Python under root's home: Debian's, given this checkout and the venv's packages.
PYTHON = "/usr/bin/python3"
SITE = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
SOURCE = str(Path(__file__).resolve().parent.parent)
END_S = 10.0  # from the terminal's end, or SIGTERM, until gpumon is gone (it ends in well under 1 s)


class TuiUser:
    """A real user with a home, the fake driver's library and machine readable to them."""

    def __init__(self, fake_driver) -> None:
        self.name = f"tty{secrets.token_hex(3)}"
        add_suite_user(self.name, "--no-create-home", "--shell", "/bin/sh")
        self.place = Path(tempfile.mkdtemp(prefix="gpumon-lost-terminal-"))
        self.place.chmod(0o755)
        self.home = self.place / "home"
        self.home.mkdir()
        entry = pwd.getpwnam(self.name)
        os.chown(self.home, entry.pw_uid, entry.pw_gid)
        self.lib = self.place / fake_driver.lib.name
        shutil.copy(fake_driver.lib, self.lib)
        self.config = self.place / "fake-nvml.conf"
        fake_driver.machine.write(self.config)
        self.config.chmod(0o644)
        # The default ledger, named after this host (usage/settings.default_path), and its TUI's lock.
        self.ledger_lock = self.home / "state" / "gpumon" / (default_path().name + ".tui.lock")

    def command(self, *args: str) -> str:
        env = {"HOME": str(self.home), "XDG_STATE_HOME": f"{self.home}/state",
               "XDG_CONFIG_HOME": f"{self.home}/config", "TZ": "UTC", "PATH": os.environ["PATH"],
               "PYTHONPATH": ":".join([SOURCE, *SITE]), "GPUMON_NVML_LIB": str(self.lib),
               "FAKE_NVML_CONFIG": str(self.config), "TERM": "xterm-256color", "LANG": "C.UTF-8",
               "GPUMON_CLAIMS_DIR": f"{self.home}/claims",
               "GPUMON_SYSTEM_CONFIG": f"{self.home}/no-system-config.toml"}
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        return f"env -i {assignments} {PYTHON} -m gpumon {shlex.join(args)}"

    def gpumon_process(self) -> psutil.Process:
        uid = pwd.getpwnam(self.name).pw_uid
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for proc in psutil.process_iter(["uids", "cmdline"]):
                uids, argv = proc.info["uids"], proc.info["cmdline"] or []
                if uids and uids.real == uid and argv[1:3] == ["-m", "gpumon"]:
                    return proc
            time.sleep(0.1)
        raise AssertionError("gpumon did not start")

    def ledger_lock_held(self) -> bool:
        fd = os.open(self.ledger_lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def remove(self) -> None:
        end_users_processes(self.name)
        subprocess.run(["userdel", self.name], capture_output=True)
        shutil.rmtree(self.place, ignore_errors=True)


@pytest.fixture
def tui_user(fake_driver):
    require_tool("su")
    if os.geteuid() != 0:
        pytest.skip("making users needs root")
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} is needed, to run as another user")
    fake_driver.machine.cards = [Card()]
    user = TuiUser(fake_driver)
    try:
        yield user
    finally:
        user.remove()


def _start(tmux_session, user: TuiUser) -> tuple[Tmux, psutil.Process]:
    tmux = tmux_session(100, 30)
    tmux.start(f"su -l {user.name} -c {shlex.quote(user.command('--interval', '0.2'))}; sleep 600")
    tmux.wait_for(lambda s: "A100" in s and "every 0.2s" in s, timeout=30, what="the TUI")
    gpumon = user.gpumon_process()
    deadline = time.monotonic() + 20
    while not (user.ledger_lock.exists() and user.ledger_lock_held()):
        assert time.monotonic() < deadline, "the TUI did not take the usage ledger's lock"
        time.sleep(0.1)
    return tmux, gpumon


def _ended(process: psutil.Process, within: float = END_S) -> bool:
    try:
        process.wait(within)
    except psutil.TimeoutExpired:
        return False
    return True


def test_a_tui_whose_terminal_is_gone_ends_and_releases_the_ledger(tui_user, tmux_session):
    tmux, gpumon = _start(tmux_session, tui_user)
    tmux("kill-session", "-t", "t")  # the terminal closes; no SIGHUP reaches su's own session
    ended = _ended(gpumon)
    if not ended:
        gpumon.send_signal(signal.SIGTERM)  # it must end on that, at least
        assert _ended(gpumon), "the TUI on a lost terminal ignored SIGTERM"
    assert ended, f"the TUI kept running {END_S:g} s after its terminal was gone"
    assert not tui_user.ledger_lock_held()


def test_sigterm_ends_a_tui_and_releases_the_ledger(tui_user, tmux_session):
    tmux, gpumon = _start(tmux_session, tui_user)
    gpumon.send_signal(signal.SIGTERM)
    assert _ended(gpumon), "the TUI ignored SIGTERM"
    assert not tui_user.ledger_lock_held()
    tmux.wait_for(lambda s: "A100" not in s, what="the terminal restored")


def _writing_blocked(pid: int) -> bool:
    """A thread of `pid` waits in write(2) to its terminal (Textual draws on standard error): nobody reads it."""
    write = {"x86_64": 1, "aarch64": 64}[os.uname().machine]
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            call = (task / "syscall").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        if len(call) > 1 and call[0] == str(write) and int(call[1], 16) in (1, 2):
            return True
    return False


def test_sigterm_ends_a_tui_whose_terminal_reads_nothing():
    """A terminal that takes no more output (a stalled link, a dead pane's unread pseudo-terminal):
    the TUI cannot restore it, and still ends on SIGTERM."""
    master, slave = pty.openpty()
    ioctl(slave, TIOCSWINSZ, struct.pack("HHHH", 60, 220, 0, 0))
    gpumon = subprocess.Popen([sys.executable, "-m", "gpumon", "--demo", "--interval", "0.1"], stdin=slave,
                              stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    try:
        deadline = time.monotonic() + 60
        while not _writing_blocked(gpumon.pid):
            assert gpumon.poll() is None and time.monotonic() < deadline, "gpumon never filled its terminal"
            os.write(master, b"\x1b[1;1R")  # the terminal's answer to each frame's question: draw on
            time.sleep(0.1)
        gpumon.send_signal(signal.SIGTERM)
        try:
            status = gpumon.wait(END_S)
        except subprocess.TimeoutExpired:
            raise AssertionError("the TUI ignored SIGTERM while its terminal took no output") from None
        assert status == 128 + signal.SIGTERM
    finally:
        if gpumon.poll() is None:
            gpumon.kill()
            gpumon.wait()
        os.close(master)
