"""The fleet's parts without a network: host lists, the ssh command line and its quoting, the
checks on what hosts send, and the remote-side commands (`snapshot --stream`, `jobs --log
--follow`, `signal`) run as the real program against the fake driver."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import Card
from sshd import remote_script
from test_cli import assert_one_line_error, gpumon

from gpumon.config import load_config
from gpumon.errors import UsageError
from gpumon.fleet import open_fleet
from gpumon.fleet.remote_claims import taken_from_remote
from gpumon.fleet.schema import SchemaError, snapshot_from_remote
from gpumon.model import FleetSnapshot, HostStatus
from gpumon.remote.hosts import expand_ranges, parse_hosts, read_hostfile
from gpumon.remote.ssh import SshTransport, describe_failure, quote_remote


def names(text: str, groups=None) -> list[str]:
    return [h.name for h in parse_hosts(text, groups)]


def test_host_lists_ranges_groups_and_files(tmp_path):
    assert names("gpu[01-03],gpu02 me@gpu[8-10]") == ["gpu01", "gpu02", "gpu03", "me@gpu8", "me@gpu9", "me@gpu10"]
    assert expand_ranges("r[1-2]n[1,3]") == ["r1n1", "r1n3", "r2n1", "r2n3"]
    groups = {"lab": ["gpu01", "@big"], "big": ["dgx[1-2]", "local"]}
    assert names("@lab,gpu01", groups) == ["gpu01", "dgx1", "dgx2", "local"]
    (spec,) = parse_hosts("ssh://me@10.0.0.5:2222")
    assert (spec.name, spec.destination, spec.port) == ("ssh://me@10.0.0.5:2222", "me@10.0.0.5", 2222)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# lab\ngpu01 gpu02  # the old ones\n\ngpu[03-04],@big\n")
    assert [h.name for h in read_hostfile(str(hostfile), groups)] == ["gpu01", "gpu02", "gpu03", "gpu04", "dgx1",
                                                                       "dgx2", "local"]


@pytest.mark.parametrize("text, words", [
    ("-oProxyCommand=touch${IFS}x", "cannot start with '-'"),
    ("gpu01,-F/tmp/x", "cannot start with '-'"),
    ("gpu01;rm -rf ~", "expected an ssh destination"),
    ("ssh://-oProxyCommand=x@h", "unexpected characters"),
    ("ssh://h:99999", "ssh://[user@]host[:port]"),
    ("gpu[5-1]", "counts down"),
    ("gpu[1-100000]", "too large"),
    ("@nosuch", "unknown host group @nosuch"),
    ("@loop", "includes itself"),
])
def test_bad_host_lists_are_refused(text, words):
    with pytest.raises(UsageError, match=words.replace("[", r"\[").replace("$", r"\$")):
        parse_hosts(text, {"loop": ["@loop"]})


def test_bad_hosts_on_the_command_line_are_one_line_and_status_2(tmp_path):
    assert_one_line_error(gpumon("snapshot", "--hosts=-oProxyCommand=touch /tmp/x", "--json"), 2,
                          "cannot start with '-'")
    assert_one_line_error(gpumon("run", "--host=-oProxyCommand=x", "--", "true"), 2, "cannot start with '-'")
    assert_one_line_error(gpumon("select", "--hostfile", str(tmp_path / "missing")), 2, "cannot read host file")
    assert_one_line_error(gpumon("snapshot", "--hosts", "h", "--ssh", "ssh 'unbalanced"), 2, "bad --ssh")
    assert_one_line_error(gpumon("--hosts", "h1", "--ssh", "ssh 'unbalanced"), 2, "bad --ssh")  # the fleet TUI
    assert_one_line_error(gpumon("jobs", "--hosts", "h1", "--ssh", "/nonexistent/ssh -x"), 2,
                          "cannot find '/nonexistent/ssh'", "--ssh")


def test_fleet_config(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[fleet]\nhosts = ["gpu01", "@lab"]\nssh = "ssh -F ~/lab"\nremote = "~/bin/gpumon"\n'
                      '[fleet.groups]\nlab = ["gpu[02-03]"]\n')
    loaded = load_config(str(config))
    assert (loaded.fleet_hosts, loaded.fleet_ssh, loaded.fleet_remote) == (
        ["gpu01", "@lab"], "ssh -F ~/lab", "~/bin/gpumon")
    assert loaded.fleet_groups == {"lab": ["gpu[02-03]"]}
    config.write_text('[fleet.groups]\nlab = "gpu01"\n')
    assert_one_line_error(gpumon("jobs", "--config", str(config)), 2, "line 2", "[fleet.groups]")


@pytest.fixture
def runtime_dir(monkeypatch):
    """A short XDG_RUNTIME_DIR of this test's own (sockets have a 108-byte path limit)."""
    path = tempfile.mkdtemp(prefix="gpm-", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_ssh_command_line(runtime_dir):
    runtime = runtime_dir
    transport = SshTransport("ssh -F ~/lab -o BatchMode=no", "~/.local/bin/gpumon")
    a, b = parse_hosts("h1,h2")
    argv = transport.gpumon_argv(a, ["jobs", "--json"])
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"]  # first: the user's BatchMode=no cannot win
    assert argv[3:5] == ["-F", os.path.expanduser("~/lab")]
    assert argv[-3:-1] == ["--", "h1"] and remote_script(argv) == "exec ~/.local/bin/gpumon jobs --json"
    assert not any("StrictHostKeyChecking" in word or "UserKnownHostsFile" in word for word in argv)
    path_a, path_b = transport.control_path(a), transport.control_path(b)
    venv = SshTransport(None, "'~/my venv/bin/python' -m gpumon")
    assert venv.gpumon_script(["jobs"]) == "exec ~/'my venv/bin/python' -m gpumon jobs"
    assert path_a != path_b and path_a.parent == Path(runtime) / "gpumon-ssh"  # one connection per host as listed
    assert stat.S_IMODE(path_a.parent.stat().st_mode) == 0o700
    assert f"ControlPath={path_a}" in argv and "ControlMaster=auto" in argv


def test_remote_quoting_gives_the_program_every_argument_byte_for_byte():
    hostile = ["$(touch pwned)", "`id`", "a'b", 'a"b', "\\", "x\ny", "", "*", "~", "-c", ";", "ünï", "\t"]
    script = "import json, sys; print(json.dumps(sys.argv[1:]))"
    line = quote_remote([sys.executable, "-c", script, *hostile])
    for shell in ("/bin/sh", "/bin/bash"):
        out = subprocess.run([shell, "-c", line], capture_output=True, text=True, check=True).stdout
        assert json.loads(out) == hostile


@pytest.mark.parametrize("code, stderr, words", [
    (255, "root@127.0.0.1: Permission denied (publickey).\r\n", "auth failed"),
    (255, "No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.\r\n"
          "Host key verification failed.\r\n", "host key unknown"),
    (255, "@@@@@@\r\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\r\n", "host key changed"),
    (255, "ssh: Could not resolve hostname gpu99: Name or service not known\r\n", "name not resolved"),
    (255, "ssh: connect to host 10.1.1.1 port 22: Connection timed out\r\n", "timeout"),
    (255, "ssh: connect to host 127.0.0.1 port 2: Connection refused\r\n", "connection refused"),
    (255, "", "connection lost"),
    (127, "bash: line 1: gpumon: command not found\n", "gpumon is not installed there"),
    (2, "gpumon: error: unrecognized arguments: --stream (see `gpumon --help`)\n", "too old"),
    (3, "gpumon: error: \x1b[2Jno NVIDIA driver\n", "gpumon: error: \\x1b[2Jno NVIDIA driver"),
])
def test_ssh_failures_in_words(code, stderr, words):
    assert words in describe_failure(code, stderr)


def _doc(**gpu) -> dict:
    return {"schema": 1, "time": 1.0, "host": "h", "backend": "nvml", "driver_version": None,
            "cuda_driver_version": None, "gpus": [{"index": 0, "uuid": "GPU-1", "name": "A", "state": "ok", **gpu}]}


@pytest.mark.parametrize("doc, words", [
    ([], "not a JSON object"),
    ({"schema": 7}, "schema 7 is unknown here"),
    (_doc(utilization_gpu=True), "utilization_gpu is not a number"),
    (_doc(temperature=math.inf), "not a finite number"),
    (_doc(memory_used=10**30), "out of range"),
    (_doc(state="on fire"), "state 'on fire' is unknown"),
    (_doc(processes=[{"pid": -1, "type": "compute"}]), "pid is missing"),
    (_doc(processes=[{"pid": 1, "type": "compute"}] * 20001), "at most 20000"),
    (dict(_doc(), gpus=[{"index": i} for i in range(300)]), "at most 256"),
])
def test_documents_from_hosts_are_checked(doc, words):
    with pytest.raises(SchemaError, match=words):
        snapshot_from_remote(doc)


def test_a_good_document_is_kept_and_made_printable():
    doc = _doc(name="A\x1b[2J" + "x" * 5000, utilization_gpu=50, power_draw=120.5, future_field={"x": 1},
               processes=[{"pid": 7, "type": "compute", "user": "\x07me", "command": "python\x1b]0;t\x07"}])
    snapshot = snapshot_from_remote(doc)
    (gpu,) = snapshot.gpus
    assert gpu.name.startswith("A\\x1b[2J") and len(gpu.name) < 200
    assert (gpu.utilization_gpu, gpu.power_draw, gpu.processes[0].command) == (50, 120.5, "python\\x1b]0;t\\x07")
    status = HostStatus("h", state="live", snapshot=snapshot)
    doc = FleetSnapshot(2.0, (status, HostStatus("down", "unreachable", error="connection refused"))).to_dict()
    assert [(h["host"], h["state"], h["error"]) for h in doc["hosts"]] == [
        ("h", "ok", None), ("down", "unreachable", "connection refused")]
    assert doc["hosts"][0]["snapshot"]["gpus"][0]["utilization_gpu"] == 50 and status.card_id(0) == "h:0"
    assert status.can_launch and not HostStatus("bare", "live", source="nvidia-smi").can_launch


def test_who_holds_a_hosts_cards_is_read_from_its_snapshot_as_text():
    claimed = _doc(claims=[{"user": "eve\x1b[2J", "job": "j1", "name": "train\x07", "since": 1.0}],
                   reservation={"user": "bob", "until": 9.0, "note": "", "mine": False})
    assert taken_from_remote(claimed) == (
        (("GPU-1", "claimed by eve\\x1b[2J: job train\\x07; reserved by bob"),), frozenset())
    assert taken_from_remote(_doc(reservation={"user": "me", "mine": True})) == ((), frozenset({"GPU-1"}))
    assert taken_from_remote(_doc()) == ((), frozenset())  # an older gpumon says nothing of claims
    for bad in ("everyone", [{}] * 300):
        with pytest.raises(SchemaError, match="claims is not a list of at most 256 claims"):
            taken_from_remote(_doc(claims=bad))


def _stream(fake_driver, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpumon", "snapshot", "--json", "--stream", *args],
                            env=fake_driver.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_stream_prints_a_document_per_sample_and_ends_when_stdin_closes(fake_driver):
    fake_driver.machine.cards = [Card("NVIDIA L4"), Card("NVIDIA L4")]
    fake_driver.write()
    proc = _stream(fake_driver, "--interval", "0.2")
    docs = [json.loads(proc.stdout.readline()) for _ in range(3)]
    assert [len(d["gpus"]) for d in docs] == [2, 2, 2] and docs[0]["time"] < docs[2]["time"]
    assert all(d["schema"] == 1 and d["gpus"][0]["name"] == "NVIDIA L4" for d in docs)
    proc.stdin.close()
    assert proc.wait(5) == 0

    slow = _stream(fake_driver, "--interval", "60")  # nothing to print for a minute: still ends at once
    slow.stdout.readline()
    started = time.monotonic()
    slow.stdin.close()
    assert slow.wait(5) == 0 and time.monotonic() - started < 3

    reader_gone = _stream(fake_driver, "--interval", "0.2")
    reader_gone.stdout.readline()
    reader_gone.stdout.close()  # the reading side goes away
    assert reader_gone.wait(5) == 0
    assert_one_line_error(fake_driver.run("snapshot", "--stream"), 2, "--json")


def test_a_hung_driver_does_not_keep_the_stream_alive(fake_driver):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    proc = _stream(fake_driver, "--interval", "0.2")
    proc.stdout.readline()
    fake_driver.machine.delays = {"nvmlDeviceGetUtilizationRates": 60000}  # the next call hangs a minute
    fake_driver.write()
    time.sleep(1.0)
    proc.stdin.close()
    assert proc.wait(10) == 0


def test_following_a_log_ends_with_the_job_or_its_reader(fake_driver):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    started = fake_driver.run("run", "--gpu", "0", "--name", "ticker", "--", "sh", "-c",
                              "echo first; sleep 0.5; echo second; sleep 60")
    assert started.returncode == 0, started.stderr
    follow = subprocess.Popen([sys.executable, "-m", "gpumon", "jobs", "--log", "ticker", "--follow"],
                              env=fake_driver.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert follow.stdout.readline() == b"first\n" and follow.stdout.readline() == b"second\n"
    follow.stdin.close()  # the other end goes away (over ssh: the connection)
    assert follow.wait(5) == 0
    whole = fake_driver.run("jobs", "--log", "ticker")
    assert whole.stdout == "first\nsecond\n"
    assert fake_driver.run("jobs", "--stop", "ticker").returncode == 0
    assert_one_line_error(fake_driver.run("jobs", "--follow"), 2, "--follow goes with --log")


def test_signal_checks_the_process(fake_driver, idle_processes):
    proc = idle_processes()
    time.sleep(0.2)
    created = os.stat(f"/proc/{proc.pid}").st_mtime
    assert_one_line_error(fake_driver.run("signal", str(proc.pid), "--started", "1000"), 2, "different process")
    assert_one_line_error(fake_driver.run("signal", str(proc.pid), "--signal", "HUP"), 2, "unknown signal")
    assert proc.poll() is None and created
    result = fake_driver.run("signal", str(proc.pid), "--signal", "SIGKILL")
    assert result.returncode == 0 and result.stdout.strip() == f"sent SIGKILL to {proc.pid}"
    assert proc.wait(5) == -9
    assert_one_line_error(fake_driver.run("signal", str(proc.pid)), 2, "already exited")


def test_local_is_a_host_read_without_ssh():
    result = gpumon("snapshot", "--json", "--hosts", "local", "--demo")
    assert result.returncode == 0, result.stderr
    (local,) = json.loads(result.stdout)["hosts"]
    assert (local["host"], local["state"], local["source"]) == ("local", "ok", "local")
    assert local["snapshot"]["backend"] == "demo" and len(local["snapshot"]["gpus"]) == 4


# An "ssh" that runs the remote command here (its last argument), for tests of the stream itself
# (bash execs a lone command, so signals reach the program, as ending ssh ends the remote side).
LOCAL_SSH = "#!/bin/bash\nfor last; do :; done\nexec /bin/bash -c \"$last\"\n"
# A "gpumon" that streams documents in bursts, so one is nearly always waiting to be read.
FLOOD = r'''#!PYTHON
import json, sys, time
line = json.dumps({"schema": 1, "time": 1.0, "host": "x", "backend": "nvml", "driver_version": None,
                   "cuda_driver_version": None, "gpus": []}).encode() + b"\n"
try:
    while True:
        sys.stdout.buffer.write(line * 20)
        sys.stdout.buffer.flush()
        time.sleep(0.002)
except BrokenPipeError:
    pass
'''


def test_stop_ends_the_fleet_even_while_documents_pour_in(tmp_path, runtime_dir):
    """A cancel that arrives with a line must not be lost (asyncio.wait_for on 3.11 drops it)."""
    ssh, flood = tmp_path / "ssh", tmp_path / "flood"
    ssh.write_text(LOCAL_SSH)
    flood.write_text(FLOOD.replace("PYTHON", sys.executable))
    for script in (ssh, flood):
        script.chmod(0o755)
    transport = SshTransport(str(ssh), str(flood), sharing=False)

    async def cycles() -> None:
        for _ in range(4):
            fleet = open_fleet(parse_hosts("a,b"), transport, interval=0.1)
            runner = asyncio.create_task(fleet.run())
            async with asyncio.timeout(20):
                while not all(s.state == "live" for s in fleet.statuses()):
                    await asyncio.sleep(0.01)
            fleet.stop()
            async with asyncio.timeout(10):  # TimeoutError here: a stream went on after stop()
                await runner

    asyncio.run(cycles())


def test_a_hosts_stale_card_fabric_and_mig_mode_come_through():
    """What was added to schema 1 later (a hung card's age, the NVSwitch fabric, MIG mode) reaches
    the fleet as the host's own gpumon reported it; nonsense in those fields reads as unknown."""
    doc = dict(_doc(), gpus=[
        {"index": 0, "uuid": "GPU-1", "name": "H100", "state": "stale", "stale_s": 12.5, "fabric": "not_started",
         "mig_mode": True},
        {"index": 1, "uuid": "GPU-2", "name": "H100", "fabric": "on fire", "mig_mode": "yes"},
    ])
    stale, odd = snapshot_from_remote(doc).gpus
    assert (stale.state, stale.stale_s, stale.fabric, stale.mig_mode) == ("stale", 12.5, "not_started", True)
    assert (odd.fabric, odd.mig_mode) == (None, None)
    with pytest.raises(SchemaError, match="stale_s is not a number"):
        snapshot_from_remote(dict(_doc(), gpus=[{"index": 0, "stale_s": "12"}]))
