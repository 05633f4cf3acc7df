"""What the fleet commands print and say with their exit status, over the real sshd: each host as
it answers (a host that lets ssh in but never answers holds up no other), and whether anything
was read (README, "Exit status": 0 all read, 4 some not, 5 none)."""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from pathlib import Path

import pytest
from conftest import Card
from test_cli import assert_one_line_error, gpumon

from gpumon.errors import EXIT_NONE_READ, EXIT_SOME_UNREAD

HANGS = """#!/bin/sh
# A host whose login works but whose gpumon never answers (a hung driver, a hung home directory).
[ -n "$GPUMON_TEST_HANG" ] && exec sleep 3600
exec {real} "$@"
"""


def _remote(ssh_lab, tmp_path: Path) -> str:
    path = tmp_path / "maybe-hung-gpumon"
    path.write_text(HANGS.format(real=ssh_lab.remote_gpumon))
    path.chmod(0o755)
    return str(path)


def _first_lines(proc: subprocess.Popen, until: str, timeout: float) -> tuple[str, float]:
    """stdout up to the first line containing `until`, and how long it took."""
    started = time.monotonic()
    seen = ""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while until not in seen and time.monotonic() - started < timeout:
            if selector.select(timeout=0.5):
                chunk = os.read(proc.stdout.fileno(), 65536).decode()
                if not chunk:
                    break
                seen += chunk
    return seen, time.monotonic() - started


def test_exit_status_says_whether_anything_was_read(ssh_lab):
    ssh_lab.host("up").machine.cards = [Card()]
    ssh_lab.hosts["up"].write()
    for command in ("snapshot", "users"):
        none = ssh_lab.gpumon(command, "--hosts", "nowhere.invalid", "--interval", "0.3")
        assert none.returncode == 5, (command, none.stdout, none.stderr)
        some = ssh_lab.gpumon(command, "--hosts", "up,nowhere.invalid", "--json", "--interval", "0.3")
        assert some.returncode == 4, (command, some.stderr)
        every = ssh_lab.gpumon(command, "--hosts", "up", "--json", "--interval", "0.3")
        assert every.returncode == 0, (command, every.stderr)
    assert ssh_lab.gpumon("jobs", "--hosts", "nowhere.invalid").returncode == 5
    assert ssh_lab.gpumon("jobs", "--hosts", "up,nowhere.invalid").returncode == 4
    # select: 0 when it chose (the unread host's reason on stderr), else 1 only when every host was read.
    chosen = ssh_lab.gpumon("select", "--hosts", "up,nowhere.invalid")
    assert chosen.returncode == 0 and chosen.stdout.startswith("up\t"), chosen.stderr
    assert ssh_lab.gpumon("select", "--hosts", "nowhere.invalid").returncode == 5
    assert ssh_lab.gpumon("select", "--hosts", "up,nowhere.invalid", "--count", "2").returncode == 4
    assert ssh_lab.gpumon("select", "--hosts", "up", "--count", "2").returncode == 1


def test_each_host_is_printed_as_it_answers(ssh_lab, tmp_path):
    ssh_lab.host("fast").machine.cards = [Card("NVIDIA A30")]
    ssh_lab.hosts["fast"].write()
    ssh_lab.host("hung", env={"GPUMON_TEST_HANG": "1"})
    remote = _remote(ssh_lab, tmp_path)
    started = ssh_lab.gpumon("run", "--host", "fast", "--gpu", "0", "--name", "quick", "--", "sleep", "60",
                             remote=remote)
    assert started.returncode == 0, started.stderr
    for args, wanted in ((["snapshot"], "NVIDIA A30"), (["jobs"], "quick")):
        proc = subprocess.Popen(ssh_lab.gpumon_argv(*args, "--hosts", "hung,fast", remote=remote),
                                env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            seen, took = _first_lines(proc, wanted, timeout=30)
            assert wanted in seen, seen
            assert took < 8 and proc.poll() is None, (args, took)  # the hung host is still being waited for
        finally:
            proc.kill()
            proc.wait(10)
    slow = ssh_lab.gpumon("snapshot", "--hosts", "hung,fast", remote=remote)
    assert slow.returncode == 4, slow.stderr
    assert slow.stdout.index("== fast: live") < slow.stdout.index("== hung:")


def test_select_hosts_takes_the_same_bars_as_select():
    here = gpumon("select", "--demo", "--count", "2", "--max-util", "100", "--max-used", "100%")
    assert here.returncode == 0, here.stderr
    over = gpumon("select", "--demo", "--count", "2", "--max-util", "100", "--max-used", "100%",
                  "--hosts", "local")
    assert over.returncode == 0, over.stderr
    assert over.stdout == f"local\t{here.stdout}"


@pytest.mark.parametrize("hosts, words", [
    ("", "--hosts is empty"), (" , ", "--hosts is empty"), ("gpu01:2222", "write ssh://gpu01:2222"),
    ("me@gpu01:22", "write ssh://me@gpu01:22"),
])
@pytest.mark.parametrize("command", ["snapshot", "users", "select", "jobs", "watch"])
def test_an_empty_or_ill_formed_host_list_is_one_line(command, hosts, words):
    assert_one_line_error(gpumon(command, "--hosts", hosts), 2, words)


def test_exit_statuses_are_documented():
    readme = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()  # "Exit status"
    assert (EXIT_SOME_UNREAD, EXIT_NONE_READ) == (4, 5)
    assert "4 a fleet command could not read some hosts" in readme and "5 it could read none" in readme
