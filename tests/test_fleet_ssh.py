"""Many hosts over a real sshd: every alias of the lab is a different fake machine (tests/sshd.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import psutil
from conftest import GIB, Card
from sshd import remote_script

UUID_A = "GPU-aaaaaaaa-1111-2222-3333-444444444444"


def gone(pid: int, timeout: float = 15) -> bool:
    """True once the process has ended (or was never there)."""
    try:
        _, alive = psutil.wait_procs([psutil.Process(pid)], timeout=timeout)
    except psutil.NoSuchProcess:
        return True
    return not alive


def hosts_of(doc: dict) -> dict[str, dict]:
    return {h["host"]: h for h in doc["hosts"]}


def test_snapshot_reads_every_host_as_its_own_machine(ssh_lab):
    h1 = ssh_lab.host("h1")
    h1.machine.cards = [Card("NVIDIA H100 80GB HBM3", uuid=UUID_A, extra=dict(util=55, temp=61))]
    h1.write()
    h2 = ssh_lab.host("h2")
    h2.machine.cards = [Card("NVIDIA A30"), Card("NVIDIA A30", extra=dict(util=12))]
    h2.write()
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "h1,h2")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == 1 and [h["host"] for h in doc["hosts"]] == ["h1", "h2"]
    one, two = hosts_of(doc)["h1"], hosts_of(doc)["h2"]
    assert (one["state"], one["error"], one["source"]) == ("ok", None, "gpumon")
    assert [(g["name"], g["uuid"], g["utilization_gpu"], g["temperature"]) for g in one["snapshot"]["gpus"]] == [
        ("NVIDIA H100 80GB HBM3", UUID_A, 55, 61)]
    assert [g["name"] for g in two["snapshot"]["gpus"]] == ["NVIDIA A30", "NVIDIA A30"]
    assert two["snapshot"]["gpus"][1]["utilization_gpu"] == 12
    assert one["snapshot"]["schema"] == 1 and one["snapshot"]["backend"] == "nvml"

    text = ssh_lab.gpumon("snapshot", "--hosts", "h1,h2")
    assert text.returncode == 0, text.stderr
    assert "== h1: live" in text.stdout and "== h2: live" in text.stdout and "NVIDIA H100 80GB HBM3" in text.stdout


def test_a_host_that_is_down_says_why_and_the_others_answer(ssh_lab):
    ssh_lab.host("up").machine.cards = [Card()]
    ssh_lab.hosts["up"].write()
    other = ssh_lab.server()
    ssh_lab.host("down", server=other)
    other.kill()
    started = time.monotonic()
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "up,down,nowhere.invalid")
    assert result.returncode == 4, result.stderr
    hosts = hosts_of(json.loads(result.stdout))
    assert hosts["up"]["state"] == "ok" and len(hosts["up"]["snapshot"]["gpus"]) == 1
    assert (hosts["down"]["state"], hosts["down"]["error"], hosts["down"]["snapshot"]) == (
        "unreachable", "connection refused", None)
    nowhere = hosts["nowhere.invalid"]
    assert (nowhere["state"], nowhere["error"]) == ("unreachable", "name not resolved")
    assert time.monotonic() - started < 30


def test_auth_and_host_key_failures_are_named(ssh_lab, tmp_path):
    stranger = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    ssh_lab.host("ok")
    ssh_lab.host("badkey", options={"IdentityFile": str(stranger)})
    unknown = tmp_path / "empty_known_hosts"
    unknown.write_text("")
    ssh_lab.host("newhost", options={"UserKnownHostsFile": str(unknown)})
    changed = tmp_path / "changed_known_hosts"
    port = ssh_lab.servers[0].port
    changed.write_text(f"[127.0.0.1]:{port} {stranger.with_suffix('.pub').read_text().split()[0]} "
                       f"{stranger.with_suffix('.pub').read_text().split()[1]}\n")
    ssh_lab.host("changed", options={"UserKnownHostsFile": str(changed)})
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "ok,badkey,newhost,changed")
    hosts = hosts_of(json.loads(result.stdout))
    assert hosts["ok"]["state"] == "ok"
    assert hosts["badkey"]["error"] == "auth failed"
    assert hosts["newhost"]["error"].startswith("host key unknown")
    assert hosts["changed"]["error"].startswith("host key changed")
    # Host key checking is never weakened: nothing was added to the known hosts files.
    assert unknown.read_text() == ""


def test_select_picks_the_best_set_on_one_host(ssh_lab):
    busy = ssh_lab.host("busy")
    # Both free (under the busy bar), but across a socket (the default link).
    busy.machine.cards = [Card(mem_total=80 * GIB, extra=dict(mem_used=5 * GIB, util=5)), Card(mem_total=80 * GIB)]
    busy.write()
    roomy = ssh_lab.host("roomy")
    roomy.machine.cards = [Card(uuid=f"GPU-0000000{i}-aaaa-bbbb-cccc-000000000000", mem_total=80 * GIB)
                           for i in range(4)]
    roomy.machine.nvlinks = [(2, 3, 12)]
    roomy.machine.links = [(0, 1, 50), (2, 3, 10), (0, 2, 50), (0, 3, 50), (1, 2, 50), (1, 3, 50)]
    roomy.write()
    result = ssh_lab.gpumon("select", "--hosts", "busy,roomy", "--count", "2", "--verbose")
    assert result.returncode == 0, result.stderr
    host, uuids = result.stdout.strip().split("\t")
    # busy could offer its two cards, but across a socket; roomy's NVLinked pair wins.
    assert host == "roomy"
    assert uuids.split(",") == ["GPU-00000002-aaaa-bbbb-cccc-000000000000", "GPU-00000003-aaaa-bbbb-cccc-000000000000"]
    assert "busy: could offer GPU 0, GPU 1" in result.stderr and "12 NVLinks" in result.stderr

    one = ssh_lab.gpumon("select", "--hosts", "busy,roomy", "--count", "3", "--min-free", "90G")
    assert one.returncode == 1 and one.stdout == ""
    assert "no host has 3 free cards" in one.stderr

    # `run --hosts … --gpu auto:2` places the job the same way, then launches it there.
    launched = ssh_lab.gpumon("run", "--hosts", "busy,roomy", "--gpu", "auto:2", "--name", "pair", "--", "sleep", "60")
    assert launched.returncode == 0, launched.stderr
    assert "roomy: GPU 2, GPU 3" in launched.stderr
    (job,) = json.loads(ssh_lab.gpumon("jobs", "--hosts", "roomy", "--json").stdout)
    assert (job["name"], job["gpus"]) == ("pair", uuids.split(","))
    wrong = ssh_lab.gpumon("run", "--hosts", "busy,roomy", "--gpu", "3", "--", "true")
    assert wrong.returncode == 2 and "use --host HOST" in wrong.stderr and wrong.stderr.count("\n") == 1


def test_jobs_across_hosts_have_a_host_column(ssh_lab):
    for alias in ("h1", "h2"):
        host = ssh_lab.host(alias)
        host.machine.cards = [Card(), Card()]
        host.write()
    for alias, gpu in (("h1", "0"), ("h2", "1")):
        launched = ssh_lab.gpumon("run", "--host", alias, "--gpu", gpu, "--name", f"job-{alias}", "--",
                                  "sleep", "60")
        assert launched.returncode == 0, launched.stderr
        assert "job " in launched.stdout
    listed = ssh_lab.gpumon("jobs", "--hosts", "h1,h2", "--json")
    assert listed.returncode == 0, listed.stderr
    jobs = json.loads(listed.stdout)
    assert [(j["host"], j["name"], j["state"], j["gpu_indices"]) for j in jobs] == [
        ("h1", "job-h1", "running", [0]), ("h2", "job-h2", "running", [1])]
    table = ssh_lab.gpumon("jobs", "--hosts", "h1,h2")
    assert table.stdout.splitlines()[0].split()[:3] == ["HOST", "ID", "NAME"]
    assert any(line.startswith("h2 ") and "job-h2" in line for line in table.stdout.splitlines())
    for job in jobs:
        stop = ssh_lab.gpumon("jobs", "--hosts", job["host"], "--stop", job["id"])
        assert stop.returncode == 0, stop.stderr
        assert gone(job["pid"])


HOSTILE_ARGS = ["plain", "two words", "$(touch pwned)", "`touch pwned`", "'single'", '"double"', "back\\slash",
                "semi;colon && touch pwned", "a\nnewline", "*", "", "--", "-c", "~", "$HOME", "ünïcödé", "tab\there",
                "!bang", "--gpu", "0"]


def test_run_on_a_host_lands_on_exactly_that_card_with_the_command_byte_for_byte(ssh_lab, tmp_path):
    ssh_lab.host("h1").machine.cards = [Card()]
    ssh_lab.hosts["h1"].write()
    h2 = ssh_lab.host("h2")
    h2.machine.cards = [Card(uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd") for i in range(4)]
    h2.machine.scan_env = True  # the fake driver lists the job on the card its CUDA_VISIBLE_DEVICES names
    h2.write()
    out = tmp_path / "argv.json"
    script = ("import json, os, sys, time; json.dump([sys.argv[1:], os.environ['CUDA_VISIBLE_DEVICES']], "
              "open(os.environ['OUT'], 'w')); time.sleep(120)")
    launched = ssh_lab.gpumon("run", "--host", "h2", "--gpu", "3", "--cwd", str(tmp_path), "--",
                              "env", f"OUT={out}", sys.executable, "-c", script, *HOSTILE_ARGS)
    assert launched.returncode == 0, launched.stderr
    assert "GPU 3" in launched.stdout.splitlines()[0]  # the host's own summary, line by line
    assert launched.stdout.splitlines()[-1].startswith("log: ")
    deadline = time.monotonic() + 30
    while not (out.exists() and out.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.1)
    argv, visible = json.loads(out.read_text())
    assert argv == HOSTILE_ARGS
    assert visible == "GPU-00000003-aaaa-bbbb-cccc-dddddddddddd"
    assert not (tmp_path / "pwned").exists()
    (job,) = json.loads(ssh_lab.gpumon("jobs", "--hosts", "h2", "--json").stdout)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # the driver lists the job once it runs with the card's UUID
        doc = json.loads(ssh_lab.gpumon("snapshot", "--json", "--hosts", "h1,h2").stdout)
        placed = {(h["host"], g["index"]) for h in doc["hosts"] for g in h["snapshot"]["gpus"]
                  for p in g["processes"] if p["pid"] == job["pid"]}
        if placed:
            break
    assert placed == {("h2", 3)}


def test_a_job_outlives_its_connection(ssh_lab):
    server = ssh_lab.server()
    ssh_lab.host("h", server=server).machine.cards = [Card()]
    ssh_lab.hosts["h"].write()
    assert ssh_lab.gpumon("run", "--host", "h", "--gpu", "0", "--", "sleep", "120").returncode == 0
    (job,) = json.loads(ssh_lab.gpumon("jobs", "--hosts", "h", "--json").stdout)
    server.kill()  # the connection and every session on the host end, as when the network drops
    time.sleep(1.0)
    assert psutil.Process(job["pid"]).is_running()
    server.start()
    (again,) = json.loads(ssh_lab.gpumon("jobs", "--hosts", "h", "--json").stdout)
    assert (again["id"], again["state"], again["pid"]) == (job["id"], "running", job["pid"])


def _remote_streams(server) -> list[psutil.Process]:
    found = []
    for proc in server.sessions():
        try:
            if "--stream" in proc.cmdline():
                found.append(proc)
        except psutil.Error:
            pass
    return found


def _ssh_clients(config) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if cmdline[:1] == ["ssh"] and str(config) in cmdline and "--stream" in remote_script(cmdline):
            found.append(proc)
    return found


def _until(condition, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    return condition()


def test_the_remote_stream_ends_with_its_connection_and_comes_back(ssh_lab):
    server = ssh_lab.server()
    ssh_lab.host("h", server=server).machine.cards = [Card()]
    ssh_lab.hosts["h"].write()
    watch = subprocess.Popen(ssh_lab.gpumon_argv("watch", "--hosts", "h", "--metrics", "--interval", "0.3"),
                             env=ssh_lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert json.loads(watch.stdout.readline())["host"] == "h"
        (stream,) = _until(lambda: _remote_streams(server))
        (client,) = _until(lambda: _ssh_clients(ssh_lab.ssh_config))
        client.kill()  # the ssh client dies: the remote stream must end, and gpumon connects again
        assert not psutil.wait_procs([stream], timeout=10)[1]
        new = _until(lambda: [p for p in _remote_streams(server) if p.pid != stream.pid])
        assert len(new) == 1
        watch.kill()  # gpumon itself dies without cleaning up: still nothing may be left on the host
        watch.wait(10)
        assert not psutil.wait_procs(new, timeout=10)[1]
        assert _until(lambda: not _ssh_clients(ssh_lab.ssh_config))
    finally:
        watch.kill()
        watch.wait(10)


def test_a_lab_host_logs_in_to_a_home_of_its_own(ssh_lab):
    """Every lab "machine" has its own home, with a new user's files: a login there never runs the
    real user's ~/.bashrc. CI once lost 28 fleet tests to it: root's .bashrc ran `pyenv init`, a
    test that ended a host (SIGKILL, as a machine going away) while its login held pyenv's rehash
    lock left the lock behind, and every later login waited 60 s for it."""
    ssh_lab.host("h")
    seen = ssh_lab.ssh_run("h", 'echo "$HOME"')
    assert seen.returncode == 0, seen.stderr
    home = seen.stdout.strip()
    assert home == str(ssh_lab.servers[0].home) and home != os.path.expanduser("~"), home
    assert home.startswith(str(ssh_lab.root))
