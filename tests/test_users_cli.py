"""Who is using the GPUs, headless: `gpumon users` and the `idle > DURATION` alert rule of `gpumon
watch`, run as the real program against the fake NVIDIA driver, whose cards list real processes in
real Slurm, kubepods and Docker shaped cgroups (tests/cgroup_lab.py) with per-process SM %; and
`users --hosts` over a real sshd (tests/sshd.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from cgroup_lab import cgroup_lab  # noqa: F401 - the fixture
from conftest import GIB, Card
from holders_lab import CONTAINER, POD, place_holders, set_load
from test_cli import assert_one_line_error
from test_watch import events_of, start_watch

JOB = ("slurm", "77")
BOX = ("container", CONTAINER[:12])


@pytest.fixture
def held(cgroup_lab, idle_processes, fake_driver):  # noqa: F811 - the fixture imported above
    """Slurm job 77 on cards 0 and 1 (60 % SM), a pod on card 0 (20 %), a Docker container on card 2 (0 %)."""
    return place_holders(cgroup_lab, idle_processes, fake_driver)


def by_key(holders: list[dict]) -> dict[tuple[str, str], dict]:
    return {(h["kind"], h["id"]): h for h in holders}


def test_users_json_after_its_window(held, fake_driver):
    result = fake_driver.run("users", "--json", "--interval", "0.3")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == 1 and "hosts" not in doc
    # Three samples by default: two intervals watched.
    assert 0.45 <= doc["window_s"] < 3
    rows = by_key(doc["holders"])
    assert set(rows) == {("user", "root"), JOB, ("k8s", POD), BOX}
    job = rows[JOB]
    assert (job["label"], job["user"], job["cards"], job["processes"], job["gpu_memory"], job["sm_util"]) == (
        "job 77", "root", [0, 1], 2, 20 * GIB, 120)
    assert all(u.startswith("GPU-") for u in job["uuids"]) and len(set(job["uuids"])) == 2
    assert job["power_w"] == pytest.approx(425, abs=0.1) and job["idle_s"] is None
    # Energy: its power share over what the window saw.
    assert job["energy_j"] == pytest.approx(425 * doc["window_s"], rel=0.1)
    box = rows[BOX]
    assert box["idle_s"] == pytest.approx(doc["window_s"], abs=0.15)  # idle all along: as long as it watched
    assert rows["user", "root"]["idle_s"] is None

    longer = fake_driver.run("users", "--json", "--interval", "0.3", "--window", "1.5s")
    assert longer.returncode == 0, longer.stderr
    doc = json.loads(longer.stdout)
    assert doc["window_s"] >= 1.3
    assert by_key(doc["holders"])[BOX]["idle_s"] >= 1.3  # a longer window sees longer idleness


def test_users_table(held, fake_driver):
    result = fake_driver.run("users", "--interval", "0.2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["WHO", "USER", "CARDS", "MEM", "SM%", "POWER", "ENERGY", "HELD", "IDLE"]
    rows = {line.split()[0] if not line.startswith("  ") else " ".join(line.split()[:2]): line.split()
            for line in lines[1:] if line.strip() and not line.startswith("Watched")}
    assert rows["root"][1:6] == ["root", "0,1,2", "26G", "140", "600W"]
    assert rows["job 77"][2:7] == ["root", "0,1", "20G", "120", "425W"]
    assert rows["job 77"][-1] == "-"  # computing
    docker = next(k for k in rows if k.startswith("docker:"))
    assert rows[docker][-1].endswith("s")  # idle, seconds as gpumon watched
    assert rows["job 77"][7:9] != ["0.00", "Wh"] and rows["job 77"][8] == "Wh"
    assert result.stdout.splitlines()[-1].startswith("Watched for ")


def test_users_bad_arguments_are_one_line(fake_driver):
    assert_one_line_error(fake_driver.run("users", "--window", "5x"), 2, "--window", "5x")
    assert_one_line_error(fake_driver.run("users", "--window"), 2, "--window")
    assert_one_line_error(fake_driver.run("users", "--hosts", "a", "--local"), 2, "--local")
    help_text = fake_driver.run("users", "--help")
    assert help_text.returncode == 0 and "longer --window sees longer idleness" in " ".join(help_text.stdout.split())


def _next_event(proc, deadline_s: float = 30) -> dict:
    line = proc.stdout.readline()
    assert line, f"watch ended: {proc.stderr.read() if proc.poll() is not None else ''}"
    return json.loads(line)


def test_idle_rule_fires_for_the_idle_job_and_resolves_when_it_computes_or_lets_go(held, fake_driver, tmp_path):
    set_load(fake_driver, held, job_sm=60, pod_sm=20, box_sm=5)
    hook_log = tmp_path / "hooks"
    hook = f'printf "%s|%s|%s|%s|%s|%s\\n" "$GPUMON_EVENT" "$GPUMON_HOLDER" "$GPUMON_USER" "$GPUMON_GPUS" ' \
           f'"$GPUMON_GPU_MEMORY" "$GPUMON_HOLDER_KIND" >> {hook_log}'
    proc = start_watch(fake_driver, "--alert", "idle > 1s", "--interval", "0.2", "--on-alert", hook)
    try:
        time.sleep(0.6)  # computing: nothing fires
        set_load(fake_driver, held, job_sm=0, pod_sm=20, box_sm=5)
        stopped = time.time()
        firing = _next_event(proc)
        # Idle since the last sample that saw it busy: at most an interval (and the driver's reload) before.
        assert firing["time"] - stopped >= 1.0 - 0.2 - 0.1 - 0.05
        assert (firing["event"], firing["rule"], firing["metric"]) == ("firing", "idle > 1s", "idle")
        assert firing["value"] > 1 and firing["threshold"] == 1
        holder = firing["holder"]
        # The job, not its user as well: one idle job fires once.
        assert (holder["kind"], holder["id"], holder["label"], holder["user"]) == ("slurm", "77", "job 77", "root")
        assert holder["cards"] == [0, 1] and len(holder["uuids"]) == 2 and holder["gpu_memory"] == 20 * GIB
        assert firing["gpu"] == 0 and firing["uuid"] == holder["uuids"][0] and holder["host"] == firing["host"]

        set_load(fake_driver, held, job_sm=50, pod_sm=20, box_sm=5)
        resolved = _next_event(proc)
        assert (resolved["event"], resolved["holder"]["id"], resolved["holder"]["processes"]) == ("resolved", "77", 2)

        # The container stops computing, then lets go of its card.
        set_load(fake_driver, held, job_sm=50, pod_sm=20, box_sm=0)
        assert (_next_event(proc)["event"], ) == ("firing", )
        fake_driver.machine.procs = [p for p in fake_driver.machine.procs if p["pid"] != held["box"]]
        fake_driver.write()
        gone = _next_event(proc)
        assert (gone["event"], gone["holder"]["kind"], gone["holder"]["processes"]) == ("resolved", "container", 0)
        assert gone["holder"]["cards"] == [2]  # what it held, for the message
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert events_of(out) == []  # nothing more: the user row never fired
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(hook_log.read_text().splitlines() if hook_log.exists() else []) < 4:
        time.sleep(0.1)
    assert hook_log.read_text().splitlines() == [
        f"firing|job 77|root|0,1|{20 * GIB}|slurm", f"resolved|job 77|root|0,1|{20 * GIB}|slurm",
        f"firing|docker:{CONTAINER[:12]}|root|2|{2 * GIB}|container",
        f"resolved|docker:{CONTAINER[:12]}|root|2|{2 * GIB}|container"]


def test_idle_rule_with_memory_and_a_replay_gives_the_same_events(held, fake_driver, tmp_path):
    recording = tmp_path / "rec.jsonl"
    rules = ["--alert", "idle > 1s and mem > 10G", "--alert", "idle > 500ms and mem < 4G"]
    set_load(fake_driver, held, job_sm=0, pod_sm=20, box_sm=0)
    proc = start_watch(fake_driver, *rules, "--interval", "0.2", "--count", "25", "--record", str(recording))
    first = _next_event(proc)
    second = _next_event(proc)
    set_load(fake_driver, held, job_sm=30, pod_sm=20, box_sm=0)  # the job computes again
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    events = [first, second, *events_of(out)]
    # The job (20G) for the first rule, the container (2G) for the second; the pod computes.
    assert [(e["event"], e["rule"], e["holder"]["id"]) for e in events] == [
        ("firing", "idle > 500ms and mem < 4G", CONTAINER[:12]), ("firing", "idle > 1s and mem > 10G", "77"),
        ("resolved", "idle > 1s and mem > 10G", "77")]
    replay = fake_driver.run("watch", *rules, "--replay", str(recording))
    assert replay.returncode == 0, replay.stderr
    assert events_of(replay.stdout) == events
    text = fake_driver.run("watch", *rules, "--replay", str(recording), "--format", "text")
    line = next(t for t in text.stdout.splitlines() if "job 77" in t)
    assert "FIRING" in line and "job 77 (root)" in line and "GPU 0,1" in line and "holding 20G on 2 cards" in line


def test_idle_rules_are_checked_and_left_out_of_prometheus_rules(fake_driver):
    bad = fake_driver.run("watch", "--alert", "idle > 30m for 5m", "--count", "1")
    assert bad.returncode == 2 and "the duration is in the condition" in bad.stderr and "Traceback" not in bad.stderr
    exported = subprocess.run([sys.executable, "-m", "gpumon", "alerts", "export", "--prometheus-rules",
                               "--alert", "idle > 30m", "--alert", "temp > 80", "--alert", "unreachable"],
                              env=fake_driver.env,
                              capture_output=True, text=True, timeout=30)
    assert exported.returncode == 0, exported.stderr
    assert '# Left out: "idle > 30m"' in exported.stdout and "DCGM_FI_DEV_GPU_TEMP > 80" in exported.stdout
    assert '# Left out: "unreachable"' in exported.stdout  # (it was a KeyError: exit 70)


def test_users_across_hosts_over_ssh(cgroup_lab, idle_processes, ssh_lab):  # noqa: F811 - the fixture
    """Host a runs Slurm job 91 (computing) and holds a card idle outside any job; host b's user holds one
    idle; host down cannot be reached and is listed as such."""
    job, loose, other = (idle_processes("sleep", "600") for _ in range(3))
    cgroup_lab.place(cgroup_lab.v2, "system.slice/slurmstepd.scope/job_91/step_0/user/task_0", job.pid)
    a = ssh_lab.host("a")
    a.machine.cards = [Card(extra={"power_mw": 250_000}), Card(extra={"power_mw": 50_000})]
    a.machine.procs = [dict(gpu=0, pid=job.pid, mem=8 * GIB, sm=70), dict(gpu=1, pid=loose.pid, mem=GIB, sm=0)]
    a.write()
    b = ssh_lab.host("b")
    b.machine.cards = [Card(extra={"power_mw": 100_000})]
    b.machine.procs = [dict(gpu=0, pid=other.pid, mem=3 * GIB, sm=0)]
    b.write()
    elsewhere = ssh_lab.server()
    ssh_lab.host("down", server=elsewhere)
    elsewhere.kill()

    result = ssh_lab.gpumon("users", "--json", "--hosts", "a,b,down", "--interval", "0.3", "--window", "1s")
    assert result.returncode == 4, result.stderr
    doc = json.loads(result.stdout)
    assert doc["window_s"] >= 0.8
    assert [(h["host"], h["state"]) for h in doc["hosts"]] == [("a", "ok"), ("b", "ok"), ("down", "unreachable")]
    assert doc["hosts"][2]["error"] == "connection refused" and "snapshot" not in doc["hosts"][2]
    rows = {(h["host"], h["kind"], h["id"]): h for h in doc["holders"]}
    assert set(rows) == {("a", "user", "root"), ("a", "slurm", "91"), ("b", "user", "root")}
    assert rows["a", "slurm", "91"]["cards"] == [0] and rows["a", "slurm", "91"]["idle_s"] is None
    assert rows["a", "slurm", "91"]["power_w"] == pytest.approx(250, abs=0.1)
    assert rows["a", "slurm", "91"]["energy_j"] == pytest.approx(250 * doc["window_s"], rel=0.4)
    assert rows["a", "user", "root"]["cards"] == [0, 1] and rows["a", "user", "root"]["idle_s"] is None
    assert rows["b", "user", "root"]["idle_s"] >= 0.8 and rows["b", "user", "root"]["gpu_memory"] == 3 * GIB

    text = ssh_lab.gpumon("users", "--hosts", "a,b,down", "--interval", "0.3")
    assert text.returncode == 4, text.stderr
    lines = [line for line in text.stdout.splitlines() if "(not read)" not in line]  # each host as it came
    assert lines[0].split()[:3] == ["HOST", "WHO", "USER"]
    rows = [line.split()[:2] for line in lines[1:4]]
    assert [r for r in rows if r[0] == "a"] == [["a", "root"], ["a", "job"]] and ["b", "root"] in rows
    assert "down: unreachable: connection refused (not read)" in text.stdout

    # The idle rule per host in `watch --hosts`: b's user, and not a's, whose job computes (the
    # processes of a user with a job on the host are that job's to answer for).
    watch = ssh_lab.gpumon("watch", "--hosts", "a,b", "--alert", "idle > 500ms", "--interval", "0.3",
                           "--count", "12")
    assert watch.returncode == 0, watch.stderr
    events = events_of(watch.stdout)
    assert [(e["event"], e["host"], e["holder"]["host"], e["holder"]["label"], e["holder"]["cards"])
            for e in events] == [("firing", "b", "b", "root", [0])]


def test_idle_rule_in_the_tui_marks_the_idle_holders_card(held, fake_driver):
    from test_tui import run, started

    from gpumon.alerting.rules import parse_rules
    from gpumon.cards.backends.nvml import NvmlBackend
    from gpumon.tui.app import create_app
    from gpumon.tui.widgets.card_list import CardList

    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        app = create_app(backend, interval=0.2, rules=parse_rules(["idle > 500ms"]))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            deadline = time.monotonic() + 30
            while 2 not in app.engine.firing() and time.monotonic() < deadline:
                await pilot.pause(0.1)
            assert app.engine.firing() == {2: ("idle > 500ms",)}  # the container's card; the job computes
            await pilot.pause(0.3)
            assert "⚠ idle > 500ms" in screen.query_one(CardList).panels[2].lines(110)[0].plain
            fired = [e for e in app.alert_log if e.event == "firing"]
            assert [(e.holder.kind, e.holder.cards) for e in fired] == [("container", (2,))]
            # One tracker per app: the rule reads the users view's (each reading's holders worked out once).
            assert app.engine._holders.tracker is app.holders

    try:
        run(go())
    finally:
        backend.close()
