"""The life of the ssh processes behind `--hosts`, over a real sshd (tests/sshd.py): a host that
lets ssh in but never sends a reading, a remote card that hangs, giving up on a host, gpumon killed
under its ssh children, and remote output that never ends."""

from __future__ import annotations

import asyncio
import json
import queue
import subprocess
import threading
import time
from pathlib import Path

import psutil
from conftest import Card

from gpumon.fleet import open_fleet
from gpumon.remote import children
from gpumon.remote.hosts import parse_hosts
from gpumon.remote.ssh import SshTransport

HOUR_MS = 3_600_000  # the fake driver's "hangs": one call that takes an hour


def until(condition, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    return condition()


def streams_on(server) -> list[psutil.Process]:
    """The remote `snapshot --stream` processes running under one sshd."""
    found = []
    for proc in server.sessions():
        try:
            if "--stream" in proc.cmdline():
                found.append(proc)
        except psutil.Error:
            pass
    return found


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


def test_a_host_whose_driver_never_opens_goes_stale_counts_as_unreachable_and_leaves_nothing_there(ssh_lab):
    ssh_lab.host("fine").machine.cards = [Card()]
    ssh_lab.hosts["fine"].write()
    hung = ssh_lab.host("hung")
    hung.machine.cards = [Card()]
    hung.machine.delays = {"nvmlInitWithFlags": HOUR_MS}  # nvmlInit never returns there
    hung.write()
    server = hung.server

    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "fine,hung", "--interval", "0.5")
    assert result.returncode == 4, result.stderr
    assert clean(result.stderr), result.stderr
    hosts = {h["host"]: h for h in json.loads(result.stdout)["hosts"]}
    assert hosts["fine"]["state"] == "ok"
    # Connected, but silent for the window a live host gets (3 intervals, at least 2 s).
    assert (hosts["hung"]["state"], hosts["hung"]["error"], hosts["hung"]["snapshot"]) == (
        "stale", "no data for 2 s", None)
    # Its gpumon there, stuck in nvmlInit, still ended with its connection.
    assert until(lambda: not streams_on(server), timeout=15), [p.cmdline() for p in streams_on(server)]

    watch = subprocess.Popen(ssh_lab.gpumon_argv("watch", "--hosts", "hung", "--alert", "unreachable",
                                                 "--interval", "0.5"),
                             env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(line) for line in watch.stdout], daemon=True).start()
        event = json.loads(lines.get(timeout=45))  # queue.Empty: no event at all
        assert (event["event"], event["host"], event["metric"], event["error"]) == (
            "firing", "hung", "unreachable", "no data for 2 s")
        watch.terminate()
        assert watch.wait(30) == 0
        assert clean(watch.stderr.read())
    finally:
        watch.kill()
        watch.wait(10)
    assert until(lambda: not streams_on(server), timeout=15)


def test_a_host_slow_to_open_its_driver_is_waited_for(ssh_lab):
    """Stale before the first reading is not an answer: a one-shot command waits for one."""
    slow = ssh_lab.host("slow")
    slow.machine.cards = [Card(extra=dict(util=42))]
    slow.machine.delays = {"nvmlInitWithFlags": 4000}
    slow.write()
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "slow", "--interval", "0.5")
    assert result.returncode == 0, result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    assert host["state"] == "ok" and host["snapshot"]["gpus"][0]["utilization_gpu"] == 42


def test_one_hung_card_on_a_host_leaves_its_other_cards_flowing(ssh_lab, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(ssh_lab.runtime_dir))
    host = ssh_lab.host("h")
    host.machine.cards = [Card(extra=dict(util=10)), Card(extra=dict(slow=HOUR_MS)), Card(extra=dict(util="0..99"))]
    host.write()
    fleet = open_fleet(parse_hosts("h"), SshTransport(ssh_lab.ssh, ssh_lab.remote_gpumon), interval=0.5)
    seen: list[tuple[str, ...]] = []
    values: set[int] = set()

    def heard(status) -> None:
        if status.snapshot is not None:
            seen.append(tuple(g.state for g in status.snapshot.gpus))
            values.add(status.snapshot.gpus[2].utilization_gpu)

    fleet.subscribe(heard)

    async def scenario() -> None:
        runner = asyncio.create_task(fleet.run())
        deadline = time.monotonic() + 60
        while len(values) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        fleet.stop()
        await runner

    asyncio.run(scenario())
    assert len(values) >= 4, f"card 2 moved through {sorted(values)} only"
    assert seen[-1] == ("ok", "stale", "ok") and fleet.status("h").state == "live"


def test_giving_up_on_a_silent_host_ends_its_ssh_cleanly(ssh_lab, tmp_path):
    # A "gpumon" that lets ssh in, then says nothing and ignores its stdin (a hung remote).
    silent = script(tmp_path / "silent-gpumon", "#!/bin/sh\nexec sleep 100000\n")
    ssh_lab.host("silent")
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "silent", "--interval", "0.5", remote=silent)
    assert result.returncode == 5, result.stderr
    assert clean(result.stderr), result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    assert (host["state"], host["error"]) == ("stale", "no data for 2 s")


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
    assert code == 5 and clean(err), err
    (host,) = json.loads(out)["hosts"]
    assert (host["state"], host["error"]) == ("error", "sent a line over 4 MiB")

    started = time.monotonic()
    code, out, err, peak = run_watching_memory(
        ssh_lab.gpumon_argv("jobs", "--hosts", "h", "--json", remote=endless), env, tmp_path)
    assert peak < CEILING, f"gpumon grew to {peak >> 20} MiB reading endless output"
    assert time.monotonic() - started < 30  # stopped at the cap, not at the 60 s timeout
    assert code == 5 and json.loads(out) == [], err
    assert err.strip() == "gpumon: h: `gpumon jobs` sent over 16 MiB (stopped there) (its jobs are not listed)"
    # Nothing of it is left running on the host either.
    assert until(lambda: not named(ssh_lab.servers[0].sessions(), "yes", "tr"), timeout=15)


def test_following_a_log_there_ends_with_gpumon(ssh_lab, tmp_path):
    """A log followed there whose remote side ignores the end of its input (an older or hung
    gpumon): its ssh ends with gpumon all the same, even when gpumon is killed."""
    deaf = script(tmp_path / "deaf-gpumon", "#!/bin/sh\necho started\nexec sleep 100000\n")
    ssh_lab.host("h")
    follow = subprocess.Popen(ssh_lab.gpumon_argv("jobs", "--hosts", "h", "--log", "j1", "--follow", remote=deaf),
                              env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert follow.stdout.readline() == b"started\n"
        (client,) = named(psutil.Process(follow.pid).children(), "ssh")
        follow.kill()
        follow.wait(10)
        assert not psutil.wait_procs([client], timeout=5)[1], client.cmdline()
    finally:
        follow.kill()
        follow.wait(10)


def test_a_child_started_from_a_passing_thread_outlives_that_thread():
    """The parent-death signal follows the thread that forked: a child asked for by a worker
    thread that then ends (the TUI's background calls) must not go with it."""
    started: list[subprocess.Popen] = []
    worker = threading.Thread(target=lambda: started.append(children.popen(["sleep", "60"])))
    worker.start()
    worker.join()
    (proc,) = started
    try:
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        assert proc.returncode is None, f"ended with {proc.returncode} when its thread did"
    finally:
        proc.kill()
        proc.wait()
