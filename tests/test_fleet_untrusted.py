"""What other hosts send is untrusted: a host without gpumon (read through a stub nvidia-smi that
answers in NVIDIA's documented CSV format), and hosts whose "gpumon" sends escape sequences, 10 MB
lines, broken JSON or another schema. Real sshd, real ssh."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from conftest import Card

# What `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` prints: a header naming the
# fields with their units in brackets (kept under nounits), ", " between values, "[N/A]" or
# "[Not Supported]" for what a card cannot say, an error and status 2 for a field it does not know.
STUB_NVIDIA_SMI = r'''#!PYTHON
import sys
UNITS = {"utilization.gpu": "%", "utilization.memory": "%", "memory.total": "MiB", "memory.used": "MiB",
         "memory.free": "MiB", "fan.speed": "%", "power.draw": "W", "power.limit": "W",
         "clocks.current.sm": "MHz", "clocks.current.memory": "MHz", "used_gpu_memory": "MiB"}
GPUS = [
    {"index": "0", "uuid": "GPU-5a1c2b3d-0000-1111-2222-333344445555", "name": "NVIDIA GeForce RTX 3090",
     "pci.bus_id": "00000000:01:00.0", "driver_version": "535.104.05", "utilization.gpu": "37",
     "utilization.memory": "12", "memory.total": "24576", "memory.used": "1034", "memory.free": "23170",
     "temperature.gpu": "45", "fan.speed": "30", "power.draw": "[N/A]", "power.limit": "350.00",
     "clocks.current.sm": "1695", "clocks.current.memory": "9751", "pstate": "P2"},
    {"index": "1", "uuid": "GPU-5a1c2b3d-0000-1111-2222-666677778888", "name": "NVIDIA GeForce RTX 3090",
     "pci.bus_id": "00000000:02:00.0", "driver_version": "535.104.05", "utilization.gpu": "0",
     "utilization.memory": "0", "memory.total": "24576", "memory.used": "3", "memory.free": "24211",
     "temperature.gpu": "31", "fan.speed": "[Not Supported]", "power.draw": "21.43", "power.limit": "350.00",
     "clocks.current.sm": "210", "clocks.current.memory": "405", "pstate": "P8"},
]
APPS = [{"gpu_uuid": GPUS[0]["uuid"], "pid": "4242", "process_name": "/usr/bin/python3", "used_gpu_memory": "1020"}]
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
fmt = args.get("--format", "").split(",")
if "csv" not in fmt:
    sys.exit("stub nvidia-smi: only --format=csv is stubbed")
if "--query-gpu" in args:
    fields, rows = args["--query-gpu"].split(","), GPUS
elif "--query-compute-apps" in args:
    fields, rows = args["--query-compute-apps"].split(","), APPS
else:
    sys.exit("stub nvidia-smi: only --query-gpu and --query-compute-apps are stubbed")
for field in fields:
    if field not in rows[0] and not (rows is APPS and field in APPS[0]):
        print(f'Field "{field}" is not a valid field to query.')
        sys.exit(2)
if "noheader" not in fmt:
    print(", ".join(f + (f" [{UNITS[f]}]" if f in UNITS else "") for f in fields))
for row in rows:
    cells = []
    for field in fields:
        value = row[field]
        if "nounits" not in fmt and field in UNITS and not value.startswith("["):
            value += " " + UNITS[field]
        cells.append(value)
    print(", ".join(cells))
'''


def test_a_host_without_gpumon_is_read_through_nvidia_smi(ssh_lab, tmp_path):
    stubs = tmp_path / "stub-bin"
    stubs.mkdir()
    stub = stubs / "nvidia-smi"
    stub.write_text(STUB_NVIDIA_SMI.replace("PYTHON", sys.executable))
    stub.chmod(0o755)
    venv_bin = str(Path(sys.executable).parent)
    with_gpumon = ssh_lab.server(env={"PATH": f"{venv_bin}:/usr/bin:/bin"})
    agentless = ssh_lab.server(env={"PATH": f"{stubs}:/usr/bin:/bin"})
    ssh_lab.host("full", server=with_gpumon).machine.cards = [Card("NVIDIA A100-SXM4-40GB")]
    ssh_lab.hosts["full"].write()
    ssh_lab.host("bare", server=agentless)
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "full,bare", remote="gpumon")
    assert result.returncode == 0, result.stderr
    hosts = {h["host"]: h for h in json.loads(result.stdout)["hosts"]}
    assert (hosts["full"]["source"], hosts["full"]["state"]) == ("gpumon", "ok")
    bare = hosts["bare"]
    assert (bare["source"], bare["state"], bare["error"]) == ("nvidia-smi", "ok", None)
    first, second = bare["snapshot"]["gpus"]
    assert (first["index"], first["name"], first["uuid"]) == (0, "NVIDIA GeForce RTX 3090",
                                                              "GPU-5a1c2b3d-0000-1111-2222-333344445555")
    assert (first["utilization_gpu"], first["memory_used"], first["memory_total"]) == (37, 1034 << 20, 24576 << 20)
    assert (first["power_draw"], first["power_limit"], first["clock_sm"], first["pstate"]) == (None, 350.0, 1695, "P2")
    assert (second["fan"], second["power_draw"], second["temperature"]) == (None, 21.43, 31)
    assert [(p["pid"], p["command"], p["gpu_memory"]) for p in first["processes"]] == [
        (4242, "/usr/bin/python3", 1020 << 20)]
    assert second["processes"] == [] and bare["snapshot"]["driver_version"] == "535.104.05"

    text = ssh_lab.gpumon("snapshot", "--hosts", "bare", remote="gpumon")
    assert "read through nvidia-smi; launching needs gpumon installed there" in text.stdout
    launch = ssh_lab.gpumon("run", "--host", "bare", "--", "true", remote="gpumon")
    assert launch.returncode == 5 and launch.stderr.count("\n") == 1  # not read, as any fleet command says
    assert "bare: gpumon is not installed there" in launch.stderr

    nothing = ssh_lab.server(env={"PATH": "/usr/bin:/bin"})
    ssh_lab.host("empty", server=nothing)
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "empty", remote="gpumon")
    (empty,) = json.loads(result.stdout)["hosts"]
    assert empty["state"] == "error"
    assert empty["error"].startswith("neither gpumon nor nvidia-smi is installed there (")


# A "gpumon" on the remote PATH that misbehaves in the way its host's GPUMON_TEST_HOSTILE says;
# without it, it is the real one.
HOSTILE_GPUMON = r'''#!PYTHON
import json, os, sys, time
mode = os.environ.get("GPUMON_TEST_HOSTILE")
if not mode or "--stream" not in sys.argv:
    os.execv("REAL", ["REAL"] + sys.argv[1:])
out = sys.stdout.buffer
evil = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x9b1m"
doc = {"schema": 1, "time": time.time(), "host": evil, "backend": "nvml", "driver_version": evil,
       "cuda_driver_version": None,
       "gpus": [{"index": 0, "uuid": "GPU-" + evil, "name": evil, "pci_bus_id": "00000000:01:00.0", "state": "ok",
                 "utilization_gpu": 5, "throttle_reasons": ["sw_thermal", evil],
                 "processes": [{"pid": 99, "user": evil, "command": evil * 3, "type": "compute"}]}]}
lines = {
    "escape": json.dumps(doc).encode(),
    "huge": b'{"schema": 1, "pad": "' + b"x" * (10 << 20) + b'"}',
    "broken": b'{"schema": 1, "time": ',
    "schema": json.dumps(dict(doc, schema=2)).encode(),
    "types": json.dumps(dict(doc, gpus=[{"index": "zero", "state": "ok"}])).encode(),
    "binary": bytes(range(256)) * 4,
}
for _ in range(100):
    out.write(lines[mode] + b"\n")
    out.flush()
    time.sleep(0.2)
'''


def test_hostile_remote_output_is_contained(ssh_lab, tmp_path):
    fake = tmp_path / "gpumon"
    fake.write_text(HOSTILE_GPUMON.replace("PYTHON", sys.executable).replace("REAL", ssh_lab.remote_gpumon))
    fake.chmod(0o755)
    ssh_lab.host("fine").machine.cards = [Card()]
    ssh_lab.hosts["fine"].write()
    modes = ("escape", "huge", "broken", "schema", "types", "binary")
    for mode in modes:
        ssh_lab.host(mode, env={"GPUMON_TEST_HOSTILE": mode})
    started = time.monotonic()
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", ",".join(("fine",) + modes), remote=str(fake))
    assert result.returncode == 4, result.stderr  # some hosts sent nothing usable
    assert time.monotonic() - started < 60
    hosts = {h["host"]: h for h in json.loads(result.stdout)["hosts"]}
    assert hosts["fine"]["state"] == "ok"
    escape = hosts["escape"]
    assert escape["state"] == "ok"
    (gpu,) = escape["snapshot"]["gpus"]
    assert gpu["name"] == "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mred\\x9b1m"
    assert gpu["throttle_reasons"] == ["sw_thermal"]  # names it does not know are dropped
    assert "\x1b" not in json.dumps(escape, ensure_ascii=False) and "\x07" not in result.stdout
    assert hosts["huge"]["state"] == "error" and hosts["huge"]["error"] == "sent a line over 4 MiB"
    assert hosts["broken"]["error"] == "sent a bad document: a line that is not JSON"
    assert "schema 2 is unknown here" in hosts["schema"]["error"]
    assert hosts["types"]["error"] == "sent a bad document: gpus[0].index is not a number"
    assert hosts["binary"]["state"] == "error" and hosts["binary"]["snapshot"] is None, hosts["binary"]

    text = ssh_lab.gpumon("snapshot", "--hosts", "fine,escape,broken", remote=str(fake))
    assert text.returncode == 4, text.stderr
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout and "\x9b" not in text.stdout
    assert "== broken: error: sent a bad document" in text.stdout


HOSTILE_JOBS = r'''#!PYTHON
import json, os, sys
if "jobs" not in sys.argv:
    os.execv("REAL", ["REAL"] + sys.argv[1:])
evil = "\x1b]0;pwned\x07\x1b[2J"
attempts = {"escape": [{"attempt": 1, "gpus": ["GPU-" + evil], "gpu_indices": [0], "pid": 7, "started": 1.0e9,
                        "ended": 1.0e9 + 5, "exit_code": None, "signal": "SIGTERM", "moved_because": evil}],
            "types": [{"attempt": "one"}], "shape": "several"}[os.environ["GPUMON_TEST_HOSTILE"]]
print(json.dumps([{"id": "20260101-000000-abcd", "name": "x", "command": ["x"], "gpus": [], "gpu_indices": [],
                   "state": "running", "failover": 2, "attempts": attempts}]))
'''


def test_hostile_job_attempts_are_text_or_refused(ssh_lab, tmp_path):
    fake = tmp_path / "gpumon"
    fake.write_text(HOSTILE_JOBS.replace("PYTHON", sys.executable).replace("REAL", ssh_lab.remote_gpumon))
    fake.chmod(0o755)
    for mode in ("escape", "types", "shape"):
        ssh_lab.host(mode, env={"GPUMON_TEST_HOSTILE": mode})
    result = ssh_lab.gpumon("jobs", "--json", "--hosts", "escape,types,shape", remote=str(fake))
    assert result.returncode == 4, result.stderr  # two hosts sent lists that are refused
    (job,) = json.loads(result.stdout)
    assert (job["host"], job["failover"]) == ("escape", 2)
    (attempt,) = job["attempts"]
    shown = "\\x1b]0;pwned\\x07\\x1b[2J"
    assert attempt["moved_because"] == shown and attempt["gpus"] == ["GPU-" + shown]
    assert (attempt["attempt"], attempt["pid"], attempt["signal"], attempt["ended"]) == (1, 7, "SIGTERM", 1.0e9 + 5)
    assert "types: unexpected job list: jobs[0].attempts[0].attempt is not a number" in result.stderr
    assert "shape: unexpected job list: jobs[0].attempts is not a list" in result.stderr
