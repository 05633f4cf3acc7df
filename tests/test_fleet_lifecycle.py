"""The life of the ssh processes behind `--hosts`, over a real sshd (tests/sshd.py): a host that
lets ssh in but never sends a reading, a remote card that hangs, giving up on a host, gpumon killed
under its ssh children, and remote output that never ends."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import psutil


def until(condition, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    return condition()


def named(procs: list[psutil.Process], *names: str) -> list[psutil.Process]:
    found = []
    for proc in procs:
        try:
            if proc.name() in names:
                found.append(proc)
        except psutil.Error:  # gone meanwhile
            pass
    return found


def script(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def clean(stderr: str) -> bool:
    return "Exception ignored" not in stderr and "Traceback" not in stderr


def test_giving_up_on_a_silent_host_ends_its_ssh_cleanly(ssh_lab, tmp_path):
    # A "gpumon" that lets ssh in, then says nothing and ignores its stdin (a hung remote).
    silent = script(tmp_path / "silent-gpumon", "#!/bin/sh\nexec sleep 100000\n")
    ssh_lab.host("silent")
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "silent", "--interval", "0.5", remote=silent)
    assert result.returncode == 0, result.stderr
    assert clean(result.stderr), result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    assert host["state"] != "live"


def test_ssh_children_die_with_gpumon(ssh_lab, tmp_path):
    """SIGKILL leaves gpumon no chance to end its ssh clients, and a remote side that ignores the
    end of its input keeps them connected: the kernel ends them (the parent-death signal)."""
    silent = script(tmp_path / "silent-gpumon", "#!/bin/sh\nexec sleep 100000\n")
    for alias in ("a", "b"):
        ssh_lab.host(alias)
    watch = subprocess.Popen(ssh_lab.gpumon_argv("watch", "--hosts", "a,b", "--alert", "unreachable",
                                                 "--interval", "0.5", remote=silent),
                             env=ssh_lab.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def ssh_children() -> list[psutil.Process]:
            return named(psutil.Process(watch.pid).children(), "ssh")

        children = until(lambda: len(ssh_children()) == 2 and ssh_children())
        assert children and len(children) == 2
        assert until(lambda: len(named([p for s in ssh_lab.servers for p in s.sessions()], "sleep")) == 2)
        watch.kill()
        watch.wait(10)
        _, alive = psutil.wait_procs(children, timeout=5)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        watch.kill()
        watch.wait(10)


ENDLESS = """#!/bin/sh
case "$*" in
  *--stream*) exec tr '\\0' x < /dev/zero ;;  # one line that never ends
  *) exec yes '{"pad": "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}' ;;
esac
"""
CEILING = 300 << 20  # gpumon itself is ~60 MiB; the caps are 4 MiB a line and 16 MiB a command


def run_watching_memory(argv: list[str], env: dict, tmp_path: Path, timeout: float = 90) -> tuple[int, str, str, int]:
    """Run gpumon, sampling its resident memory; killed past CEILING (the test then fails)."""
    out, err = tmp_path / "out", tmp_path / "err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr)
    peak = 0
    deadline = time.monotonic() + timeout
    try:
        ps = psutil.Process(proc.pid)
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                peak = max(peak, ps.memory_info().rss)
            except psutil.Error:
                break
            if peak > CEILING:
                break
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            proc.kill()
        code = proc.wait(10)
    return code, out.read_text(), err.read_text(), peak


def test_remote_output_that_never_ends_is_cut_and_stopped(ssh_lab, tmp_path):
    endless = script(tmp_path / "endless-gpumon", ENDLESS)
    ssh_lab.host("h")
    env = ssh_lab.env()

    code, out, err, peak = run_watching_memory(
        ssh_lab.gpumon_argv("snapshot", "--json", "--hosts", "h", remote=endless), env, tmp_path)
    assert peak < CEILING, f"gpumon grew to {peak >> 20} MiB reading an endless line"
    assert code == 0 and clean(err), err
    (host,) = json.loads(out)["hosts"]
    assert (host["state"], host["error"]) == ("error", "sent a line over 4 MiB")

    started = time.monotonic()
    code, out, err, peak = run_watching_memory(
        ssh_lab.gpumon_argv("jobs", "--hosts", "h", "--json", remote=endless), env, tmp_path)
    assert peak < CEILING, f"gpumon grew to {peak >> 20} MiB reading endless output"
    assert time.monotonic() - started < 30  # stopped at the cap, not at the 60 s timeout
    assert code == 0 and json.loads(out) == [], err
    assert err.strip() == "gpumon: h: `gpumon jobs` sent over 16 MiB (stopped there) (its jobs are not listed)"
    # Nothing of it is left running on the host either.
    assert until(lambda: not named(ssh_lab.servers[0].sessions(), "yes", "tr"), timeout=15)
