"""The fleet over time, over a real sshd: host states and reconnects (the API the TUI uses),
`watch --hosts`, and actions on a host's jobs and processes."""

from __future__ import annotations

import asyncio
import json
import queue
import signal
import subprocess
import threading
import time

import psutil
import pytest
from conftest import Card

from gpumon.fleet import open_fleet
from gpumon.jobs.host import HostError, host_for
from gpumon.jobs.launch import LaunchRequest, shell_request
from gpumon.remote.hosts import parse_hosts
from gpumon.remote.ssh import SshTransport


@pytest.fixture
def lab_env(ssh_lab, monkeypatch):
    """Run the fleet in this process with the lab's shared-connection directory."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(ssh_lab.runtime_dir))
    return ssh_lab


async def until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def test_a_lost_host_is_unreachable_with_the_reason_then_reconnects_while_others_stay_live(lab_env):
    lab = lab_env
    steady_server, flaky_server = lab.server(), lab.server()
    lab.host("steady", server=steady_server).machine.cards = [Card(extra=dict(util=30))]
    lab.host("flaky", server=flaky_server).machine.cards = [Card(), Card()]
    for host in lab.hosts.values():
        host.write()
    fleet = open_fleet(parse_hosts("steady,flaky"), SshTransport(lab.ssh, lab.remote_gpumon), interval=0.3)
    seen: list[tuple[str, str, str | None]] = []
    fleet.subscribe(lambda s: seen.append((s.host, s.state, s.error)))
    steady_updates: list[float] = []
    fleet.subscribe(lambda s: s.host == "steady" and s.state == "live" and steady_updates.append(time.monotonic()))

    async def scenario() -> None:
        runner = asyncio.create_task(fleet.run())
        await until(lambda: all(s.state == "live" for s in fleet.statuses()))
        assert len(fleet.status("flaky").snapshot.gpus) == 2
        history = fleet.history("steady")
        flaky_server.kill()
        down_at = time.monotonic()
        await until(lambda: fleet.status("flaky").state == "unreachable"
                    and fleet.status("flaky").error == "connection refused")
        status = fleet.status("flaky")
        assert status.retry_at is not None and status.snapshot is not None  # the last reading is kept
        assert status.to_dict()["state"] == "unreachable" and status.to_dict()["snapshot"] is None
        await asyncio.sleep(2.0)
        # One host's trouble stalls no other: steady kept answering every interval.
        assert len([t for t in steady_updates if t > down_at]) >= 4
        assert fleet.status("steady").state == "live"
        flaky_server.start()
        await until(lambda: fleet.status("flaky").state == "live", timeout=45)
        assert fleet.document().to_dict()["hosts"][1]["state"] == "ok"
        assert len(history.series(fleet.status("steady").snapshot.gpus[0].uuid, "util")[0]) >= 4
        fleet.stop()
        await runner

    asyncio.run(asyncio.wait_for(scenario(), 120))
    states = [state for host, state, _ in seen if host == "flaky"]
    assert states[0] == "live"  # from "connecting", the state every host starts in
    assert "unreachable" in states and "reconnecting" in states[states.index("unreachable"):]
    assert states[-1] == "live"


def test_a_hung_card_is_stale_on_a_live_host_and_a_silent_host_goes_stale(lab_env):
    """One card whose driver calls hang is that card's trouble: its host keeps streaming (the
    other cards stay fresh) with the card marked stale. A host whose stream goes silent (the
    link or the remote gpumon stalls) is stale as a whole, and live again when lines come back."""
    lab = lab_env
    slow = lab.host("slow")
    slow.machine.cards = [Card(extra=dict(util=11)), Card(extra=dict(util=22))]
    slow.write()
    fleet = open_fleet(parse_hosts("slow"), SshTransport(lab.ssh, lab.remote_gpumon), interval=0.3)

    def card_state(index: int) -> str | None:
        snapshot = fleet.status("slow").snapshot
        return snapshot.gpus[index].state if snapshot is not None else None

    async def scenario() -> None:
        runner = asyncio.create_task(fleet.run())
        await until(lambda: fleet.status("slow").state == "live" and card_state(0) == "ok")
        slow.machine.cards[0].extra["slow"] = 4000  # every call on card 0 now takes 4 s
        slow.write()
        await until(lambda: card_state(0) == "stale")
        assert fleet.status("slow").state == "live" and card_state(1) == "ok"
        del slow.machine.cards[0].extra["slow"]
        slow.write()
        await until(lambda: card_state(0) == "ok")

        stream = next(p for p in slow.server.sessions() if "--stream" in p.cmdline())
        stream.send_signal(signal.SIGSTOP)  # a stream that says nothing more
        try:
            await until(lambda: fleet.status("slow").state == "stale")
            assert fleet.status("slow").to_dict()["state"] == "stale"
        finally:
            stream.send_signal(signal.SIGCONT)
        await until(lambda: fleet.status("slow").state == "live")
        fleet.stop()
        await runner

    asyncio.run(asyncio.wait_for(scenario(), 90))


def _reader(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in stream], daemon=True).start()
    return lines


def _next_event(lines: queue.Queue, match, timeout: float = 45.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            event = json.loads(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        except queue.Empty:
            break
        if match(event):
            return event
    raise AssertionError("no such event in time")


def test_watch_evaluates_every_card_of_every_host_and_knows_unreachable(ssh_lab, tmp_path):
    hot_server, cool_server = ssh_lab.server(), ssh_lab.server()
    ssh_lab.host("hot", server=hot_server).machine.cards = [Card(extra=dict(temp=50)), Card(extra=dict(temp=91))]
    ssh_lab.host("cool", server=cool_server).machine.cards = [Card(extra=dict(temp=40))]
    for host in ssh_lab.hosts.values():
        host.write()
    hook_log = tmp_path / "hooks.log"
    watch = subprocess.Popen(ssh_lab.gpumon_argv(
        "watch", "--hosts", "hot,cool", "--alert", "temp > 80", "--alert", "unreachable", "--interval", "0.3",
        "--on-alert", f'echo "$GPUMON_HOST|$GPUMON_GPU|$GPUMON_EVENT|$GPUMON_RULE|$GPUMON_ERROR" >> {hook_log}'),
        env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = _reader(watch.stdout)
        temp = _next_event(lines, lambda e: e["metric"] == "temp")
        assert (temp["event"], temp["host"], temp["gpu"], temp["value"]) == ("firing", "hot", 1, 91)
        cool_server.kill()
        down = _next_event(lines, lambda e: e["metric"] == "unreachable")
        assert (down["event"], down["host"], down["gpu"], down["uuid"]) == ("firing", "cool", None, None)
        assert down["error"] in ("connection lost", "connection refused", "connection closed")
        cool_server.start()
        back = _next_event(lines, lambda e: e["metric"] == "unreachable")
        assert (back["event"], back["host"]) == ("resolved", "cool")
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(30) == 0
    finally:
        watch.kill()
        watch.wait(10)
    hooks = hook_log.read_text().splitlines()
    assert "hot|1|firing|temp > 80|" in hooks
    assert any(line.startswith("cool||firing|unreachable|connection") for line in hooks)
    assert "cool||resolved|unreachable|" in hooks


def test_signal_and_follow_a_log_on_a_host(lab_env, idle_processes):
    lab = lab_env
    lab.host("h").machine.cards = [Card()]
    lab.hosts["h"].write()
    fleet = open_fleet(parse_hosts("h"), SshTransport(lab.ssh, lab.remote_gpumon), interval=1.0)
    remote = host_for(fleet, "h")
    victim = idle_processes()
    started = psutil.Process(victim.pid).create_time()
    with pytest.raises(HostError, match="different process"):
        remote.signal(victim.pid, started - 100, "terminate")
    assert victim.poll() is None
    assert remote.signal(victim.pid, started, "terminate") == f"sent SIGTERM to {victim.pid}"
    assert victim.wait(10) == -signal.SIGTERM
    with pytest.raises(HostError, match="already exited"):
        remote.signal(victim.pid, started, "kill")

    output = remote.launch(LaunchRequest(["sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.3; done"], "0"))
    job_id = output.split()[1]
    follower = remote.follow_log(job_id)
    out = follower.stdout.read()  # stdin stays open: the tail ends by itself when the job does
    assert out.decode().split() == ["line", "1", "line", "2", "line", "3"]
    assert follower.wait(30) == 0
    output = remote.launch(LaunchRequest(["sh", "-c", "for i in 4 5 6; do echo line $i; sleep 1; done"], "0"))
    cli = lab.gpumon("jobs", "--hosts", "h", "--log", output.split()[1], "--follow")
    assert cli.returncode == 0 and cli.stdout.split() == ["line", "4", "line", "5", "line", "6"]

    # What the run dialog sends: a typed command line, run by the host's shell exactly as typed.
    typed = """echo "$((6*7))" 'a  b' "it's" | tr a x; echo $GPUMON_JOB_ID | grep -c ."""
    output = remote.launch(shell_request(typed, "0"))
    follower = remote.follow_log(output.split()[1])
    assert follower.stdout.read().decode() == "42 x  b it's\n1\n"
    follower.wait(30)

    remote.launch(LaunchRequest(["sh", "-c", "while :; do echo tick; sleep 0.2; done"], "0", name="forever"))
    (job,) = [j for j in remote.jobs() if j["name"] == "forever"]
    follower = remote.follow_log(job["id"])
    assert follower.stdout.readline() == b"tick\n"
    server = lab.servers[0]
    tails = [p for p in server.sessions() if "--follow" in p.cmdline()]
    assert len(tails) == 1
    follower.kill()  # the viewer goes away: the remote tail must not outlive it
    follower.wait(10)
    assert not psutil.wait_procs(tails, timeout=10)[1]
    assert remote.stop(job["id"]).startswith("stopping job")
