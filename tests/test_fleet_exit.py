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


def _first_lines(proc: subprocess.Popen, until: str, timeout: float, pipe=None) -> tuple[str, float]:
    """stdout (or `pipe`) up to the first line containing `until`, and how long it took."""
    pipe = proc.stdout if pipe is None else pipe
    started = time.monotonic()
    seen = ""
    with selectors.DefaultSelector() as selector:
        selector.register(pipe, selectors.EVENT_READ)
        while until not in seen and time.monotonic() - started < timeout:
            if selector.select(timeout=0.5):
                chunk = os.read(pipe.fileno(), 65536).decode()
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


# Every fleet command that prints per host: a line of the fast host's answer, and what it prints
# only once the hung host is done with (a command that printed everything at the end would show
# them together).
STREAMED = {
    "snapshot": (["snapshot", "--interval", "0.5"], "NVIDIA A30", "hung"),
    "jobs": (["jobs"], "quick", "hung"),
    "users": (["users", "--interval", "0.5"], "fast ", "Watched for"),  # its row: fast, who holds its card
    "health": (["health", "--interval", "0.5"], "GPU fast:0", "hung"),
    "queue": (["queue"], "fast: no jobs are waiting", "hung"),
    "reserve": (["reserve", "--list"], "fast: no cards are reserved", "hung"),
    "release": (["release"], "fast: you hold no reservation", "hung"),
}
# Those that end by themselves once the hung host's settle timeout has passed (the others wait
# 60 s for its answer), and the exit status they end with: 4 some host unread; health's 2, fail.
ENDS_WITH = {"snapshot": 4, "users": 4, "health": 2}


def test_each_host_is_printed_as_it_answers(ssh_lab, tmp_path, idle_processes):
    """Each command's lines of the host that answers are read from its pipe while the other host
    still hangs (the command is still waiting for it); then its status says what was read."""
    holder = idle_processes("sleep", "600")
    ssh_lab.host("fast").machine.cards = [Card("NVIDIA A30")]
    ssh_lab.hosts["fast"].machine.procs = [dict(gpu=0, pid=holder.pid, mem=1 << 30)]
    ssh_lab.hosts["fast"].write()
    ssh_lab.host("hung", env={"GPUMON_TEST_HANG": "1"})
    remote = _remote(ssh_lab, tmp_path)
    started = ssh_lab.gpumon("run", "--host", "fast", "--gpu", "0", "--name", "quick", "--", "sleep", "60",
                             remote=remote)
    assert started.returncode == 0, started.stderr
    procs = {name: subprocess.Popen(ssh_lab.gpumon_argv(*args, "--hosts", "hung,fast", remote=remote),
                                    env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name, (args, _, _) in STREAMED.items()}
    try:
        seen = {}
        for name, (_, wanted, not_yet) in STREAMED.items():
            # (well before the hung host's 60 s: a command that waited for it shows nothing by then)
            seen[name], _ = _first_lines(procs[name], wanted, timeout=30)
            assert wanted in seen[name], (name, seen[name], procs[name].poll())
            assert procs[name].poll() is None, name  # the hung host is still being waited for
            assert not_yet not in seen[name], (name, seen[name])
        for name, status in ENDS_WITH.items():
            rest, errors = procs[name].communicate(timeout=90)
            out = seen[name] + rest.decode()
            assert procs[name].returncode == status, (name, out, errors)
            assert out.index(STREAMED[name][1]) < out.index("hung"), (name, out)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(10)


def test_report_says_a_host_that_failed_while_another_still_hangs(ssh_lab, tmp_path):
    ssh_lab.host("hung", env={"GPUMON_TEST_HANG": "1"})
    proc = subprocess.Popen(ssh_lab.gpumon_argv("report", "--hosts", "hung,nowhere.invalid",
                                                remote=_remote(ssh_lab, tmp_path)),
                            env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        said, _ = _first_lines(proc, "nowhere.invalid", timeout=30, pipe=proc.stderr)
        assert "nowhere.invalid" in said, said
        assert proc.poll() is None, "still waiting for the hung host"
    finally:
        proc.kill()
        proc.wait(10)


def test_the_sharing_commands_say_whether_every_host_answered(ssh_lab):
    ssh_lab.host("up").machine.cards = [Card()]
    ssh_lab.hosts["up"].write()
    for args in (["queue"], ["queue", "--json"], ["reserve", "--list"], ["release"]):
        assert ssh_lab.gpumon(*args, "--hosts", "up").returncode == 0, args
        some = ssh_lab.gpumon(*args, "--hosts", "up,nowhere.invalid")
        assert some.returncode == 4 and "nowhere.invalid" in some.stdout + some.stderr, (args, some.stdout, some.stderr)
        assert ssh_lab.gpumon(*args, "--hosts", "nowhere.invalid").returncode == 5, args


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


def test_watch_hosts_ending_by_itself_says_whether_every_host_was_read(ssh_lab):
    """`watch --hosts … --count N`: the fleet's exit status (a SIGTERM or a closed stdout is 0)."""
    ssh_lab.host("up").machine.cards = [Card()]
    ssh_lab.hosts["up"].write()
    watch = ("watch", "--alert", "unreachable", "--interval", "0.3", "--count", "8")
    every = ssh_lab.gpumon(*watch, "--hosts", "up")
    assert every.returncode == 0, every.stderr
    some = ssh_lab.gpumon(*watch, "--hosts", "up,nowhere.invalid")
    assert some.returncode == 4, some.stderr
    assert '"host": "nowhere.invalid"' in some.stdout and "name not resolved" in some.stdout  # it fired
    assert ssh_lab.gpumon(*watch, "--hosts", "nowhere.invalid").returncode == 5
