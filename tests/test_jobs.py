"""Jobs: pinned launches on the fake driver, detaching, records, the memory watchdog, queueing."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import GIB, Card

from gpumon.jobs import files
from gpumon.jobs.limits import limit_environment

FAKE_TORCH = Path(__file__).parent / "fake_torch"


def four_cards(machine) -> None:
    """Cards with their own UUIDs and CPU affinities (this machine may have only CPUs 0 and 1);
    cards 0 and 1 are busy, 2 and 3 free, 3 the least loaded."""
    machine.cards = [
        Card("NVIDIA A40", uuid=f"GPU-{i}{i}{i}{i}aaaa-1111-2222-3333-44445555666{i}",
             bus=f"00000000:{0x21 + i:02X}:00.0",
             mem_total=48 * GIB, extra=dict(cpus="0" if i % 2 == 0 else "1", numa=i // 2, mem_used=used * GIB,
                                            util=util))
        for i, (used, util) in enumerate([(40, 80), (30, 60), (3, 8), (1, 4)])
    ]


def run_job(fake_driver, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return fake_driver.run("run", "--interval", "0.2", *args, timeout=timeout)


def wait_for(predicate, timeout: float = 20.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def job_json(fake_driver) -> list[dict]:
    return json.loads(fake_driver.run("jobs", "--json").stdout)


def env_probe(tmp_path: Path) -> list[str]:
    out = tmp_path / "probe.json"
    code = ("import json, os; json.dump({'env': dict(os.environ), 'cpus': sorted(os.sched_getaffinity(0)),"
            f" 'sid': os.getsid(0), 'stdin': os.readlink('/proc/self/fd/0')}}, open({str(out)!r}, 'w'))")
    return [sys.executable, "-c", code]


def read_probe(tmp_path: Path) -> dict:
    path = tmp_path / "probe.json"
    wait_for(lambda: path.exists() and path.stat().st_size > 0, what="the job's probe")
    time.sleep(0.1)
    return json.loads(path.read_text())


def test_run_pins_by_uuid_with_pci_order_and_local_cpus(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.write()
    result = run_job(fake_driver, "--gpu", "3", "--", *env_probe(tmp_path))
    assert result.returncode == 0, result.stderr
    probe = read_probe(tmp_path)
    uuid = fake_driver.machine.cards[3].uuid
    assert probe["env"]["CUDA_VISIBLE_DEVICES"] == uuid
    assert probe["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert probe["env"]["GPUMON_JOB_ID"] in result.stdout
    expected = {1} & os.sched_getaffinity(0) or os.sched_getaffinity(0)
    assert set(probe["cpus"]) == expected
    assert "GPU 3" in result.stdout and "log:" in result.stdout
    (job,) = job_json(fake_driver)
    assert job["gpus"] == [uuid] and job["gpu_indices"] == [3]


def test_no_numa_leaves_affinity_alone(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "3", "--no-numa", "--", *env_probe(tmp_path))
    assert set(read_probe(tmp_path)["cpus"]) == os.sched_getaffinity(0)


@pytest.mark.parametrize(("spec", "index"), [
    ("auto", 3), ("GPU-2222", 2), ("0000:22:00.0", 1), ("00000000:21:00.0", 0), ("2,3", None),
])
def test_gpu_specs(fake_driver, tmp_path, spec, index):
    four_cards(fake_driver.machine)
    fake_driver.write()
    result = run_job(fake_driver, "--gpu", spec, "--", *env_probe(tmp_path))
    assert result.returncode == 0, result.stderr
    visible = read_probe(tmp_path)["env"]["CUDA_VISIBLE_DEVICES"]
    cards = fake_driver.machine.cards
    if index is None:
        assert visible == f"{cards[2].uuid},{cards[3].uuid}"
    else:
        assert visible == cards[index].uuid  # auto: card 3 has the most free memory


@pytest.mark.parametrize(("args", "words"), [
    (["--gpu", "7", "--", "true"], ["no card 7"]),
    (["--gpu", "GPU-nope", "--", "true"], ["GPU-nope"]),
    (["--gpu", "auto:x", "--", "true"], ["auto:x"]),
    (["--gpu", "1,1", "--", "true"], ["twice"]),
    (["--gpu", "banana", "--", "true"], ["banana"]),
    (["--mem-limit", "2Q", "--", "true"], ["2Q"]),
    (["--gpu", "0"], ["no command"]),
    (["--gpu", "0", "--"], ["no command"]),
    (["--cwd", "/nonexistent/dir", "--", "true"], ["/nonexistent/dir"]),
    (["--gpu", "auto:5", "--", "true"], ["auto:5"]),
])
def test_bad_run_input_is_one_line_and_exit_2(fake_driver, args, words):
    four_cards(fake_driver.machine)
    fake_driver.write()
    result = run_job(fake_driver, *args)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    for word in words:
        assert word in result.stderr
    assert job_json(fake_driver) == []


def test_detached_job_survives_its_launcher_in_its_own_session(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.write()
    marker, go = tmp_path / "still-running", tmp_path / "go"
    # The job waits for the test's word, not a timer: under load the checks below may take seconds.
    script = (f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.02)\n"
              f"open({str(marker)!r}, 'w').write(str(os.getsid(0)))")
    result = run_job(fake_driver, "--gpu", "0", "--", sys.executable, "-c", script)
    assert result.returncode == 0
    (job,) = job_json(fake_driver)
    assert job["state"] == "running"
    assert os.getsid(job["pid"]) != os.getsid(0)  # its own session: no controlling terminal, no SIGHUP
    assert os.readlink(f"/proc/{job['pid']}/fd/0") == "/dev/null"
    go.touch()
    wait_for(lambda: marker.exists(), what="the job to finish on its own")
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["state"] == "exited"], what="exited state")
    assert job["exit_code"] == 0 and job["ended"] >= job["started"]


def test_output_log_and_exit_code(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "1", "--name", "trainer", "--", "sh", "-c", "echo out; echo err >&2; exit 5")
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["state"] == "exited"], what="exit")
    assert (job["name"], job["exit_code"], job["gpu_indices"]) == ("trainer", 5, [1])
    assert Path(job["log"]).read_text() == "out\nerr\n"
    table = fake_driver.run("jobs").stdout
    assert "trainer" in table and "exited" in table and " 5 " in table


def test_records_are_private(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--", "true")
    (job,) = job_json(fake_driver)
    directory = Path(job["log"]).parent
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in ("job.json", "output.log"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600


def test_foreground_runs_here_and_returns_the_exit_code(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    result = run_job(fake_driver, "--gpu", "2", "--foreground", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; exit 4")
    assert result.returncode == 4
    assert result.stdout.strip() == fake_driver.machine.cards[2].uuid
    (job,) = job_json(fake_driver)
    assert job["state"] == "exited" and job["exit_code"] == 4


def test_watchdog_stops_a_job_over_its_limit_and_spares_others(fake_driver, tmp_path, idle_processes):
    four_cards(fake_driver.machine)
    bystander = idle_processes()  # someone else's process on the same card, far over the limit
    fake_driver.machine.procs = [dict(gpu=1, pid=bystander.pid, mem=20 * GIB)]
    fake_driver.write()
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    result = run_job(fake_driver, "--gpu", "1", "--mem-limit", "2G", "--", sys.executable, "-c", script)
    assert "memory limit 2.0G" in result.stdout and "watchdog" in result.stdout
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid"))
    time.sleep(1.0)
    (job,) = job_json(fake_driver)
    assert job["state"] == "running", "under the limit (the bystander does not count)"
    fake_driver.machine.procs.append(dict(gpu=1, pid=pid, mem=3 * GIB))  # the driver now reports 3 GiB
    fake_driver.write()
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["state"] == "killed"], what="the watchdog")
    assert job["reason"] == "memory limit exceeded on GPU 1: 3.0 GiB > 2.0 GiB"
    assert job["peak_gpu_memory"] == 3 * GIB and job["mem_limit"] == 2 * GIB
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert bystander.poll() is None


def test_memory_limit_environment(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--mem-limit", "25%", "--", *env_probe(tmp_path))
    env = read_probe(tmp_path)["env"]
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.2500" and env["XLA_CLIENT_MEM_FRACTION"] == "0.2500"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false" and env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["GPUMON_TORCH_MEMORY_FRACTION"] == "0.2500"


def test_torch_hook_caps_only_when_cuda_initialises(tmp_path):
    extra, applied = limit_environment(4 * GIB, [16 * GIB], {"PYTHONPATH": str(FAKE_TORCH)})
    assert "pytorch" in applied and "watchdog" in applied
    env = dict(os.environ) | extra
    check = ("import torch; print('before', torch.cuda.initialised_ever); torch.cuda.init(); "
             "print('after', sorted(torch.cuda.fractions.items()))")
    out = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["before False", "after [(0, 0.25), (1, 0.25)]"]
    plain = subprocess.run([sys.executable, "-c", "import json; print('ok')"], env=env, capture_output=True,
                           text=True, timeout=30)
    assert plain.stdout == "ok\n" and "torch" not in plain.stderr


def test_torch_hook_keeps_an_existing_sitecustomize(tmp_path):
    (tmp_path / "sitecustomize.py").write_text("import os; os.environ['THEIRS'] = 'ran'\n")
    extra, _ = limit_environment(GIB, [16 * GIB], {"PYTHONPATH": f"{FAKE_TORCH}{os.pathsep}{tmp_path}"})
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('THEIRS'))"],
                         env=dict(os.environ) | extra, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "ran"


def test_wait_queues_until_the_card_is_free_and_can_be_cancelled(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    for card in fake_driver.machine.cards:
        card.extra["mem_used"] = 47 * GIB
    fake_driver.write()
    result = run_job(fake_driver, "--gpu", "auto", "--wait", "--min-free", "10G", "--", *env_probe(tmp_path))
    assert result.returncode == 0 and "queued" in result.stdout
    time.sleep(1.0)
    (job,) = job_json(fake_driver)
    assert job["state"] == "queued" and job["pid"] is None
    fake_driver.machine.cards[2].extra["mem_used"] = GIB  # card 2 frees up
    fake_driver.write()
    probe = read_probe(tmp_path)
    assert probe["env"]["CUDA_VISIBLE_DEVICES"] == fake_driver.machine.cards[2].uuid
    (job,) = job_json(fake_driver)
    assert job["gpu_indices"] == [2]

    run_job(fake_driver, "--gpu", "0", "--wait", "--min-free", "10G", "--name", "patient", "--", "true")
    queued = wait_for(lambda: [j for j in job_json(fake_driver) if j["name"] == "patient" and j["state"] == "queued"],
                      what="second job queued")
    stop = fake_driver.run("jobs", "--stop", queued[0]["id"])
    assert stop.returncode == 0
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver)
                               if j["name"] == "patient" and j["state"] == "cancelled"], what="cancelled")
    assert job["pid"] is None and job["reason"] == "cancelled by the user"


def test_stop_a_running_job_then_prune(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--name", "long", "--", "sleep", "60")
    (job,) = job_json(fake_driver)
    assert fake_driver.run("jobs", "--stop", "long").returncode == 0
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["state"] == "killed"], what="stopped")
    assert job["reason"] == "stopped by the user"
    assert fake_driver.run("jobs", "--stop", "long").returncode == 2
    assert "removed 1" in fake_driver.run("jobs", "--prune").stdout
    assert job_json(fake_driver) == []


def test_lost_when_supervisor_and_command_die_without_a_record(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--", "sleep", "60")
    (job,) = job_json(fake_driver)
    supervisor = json.loads((Path(job["log"]).parent / "supervisor.json").read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    os.kill(job["pid"], signal.SIGKILL)
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["state"] == "lost"], what="lost")
    assert job["exit_code"] is None and "unknown" in job["reason"]


def test_ctrl_c_while_the_supervisor_starts_up_cancels_the_job_before_its_command(fake_driver, tmp_path):
    """Ctrl-C between `gpumon run --foreground` and the command's start (a driver slow to answer
    the supervisor): the job is cancelled and its command never runs; it is not started and then
    stopped with SIGTERM."""
    from gpumon.jobs import records

    four_cards(fake_driver.machine)
    fake_driver.write()
    ran = tmp_path / "ran"
    # Its own process group, as a terminal's foreground job: Ctrl-C is SIGINT to the whole group.
    launch = subprocess.Popen(
        [sys.executable, "-m", "gpumon", "run", "--interval", "0.2", "--gpu", "2", "--foreground", "--",
         "sh", "-c", f"touch {ran}; exec sleep 60"],
        env=fake_driver.env, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        (job,) = wait_for(records.list_jobs, what="the job's record")
        fake_driver.machine.delays = {"*": 300}  # from here the driver answers the supervisor slowly
        fake_driver.write()
        wait_for((job.dir / "supervisor.json").exists, what="the supervisor")
        assert not (job.dir / "process.json").exists(), "the command started before the driver slowed"
        os.killpg(launch.pid, signal.SIGINT)
        out, err = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
    assert "Traceback" not in err, err
    assert launch.returncode == 130, out + err
    (ended,) = records.list_jobs()
    assert (ended.state, ended.pid, ended.reason) == ("cancelled", None, "interrupted by the user")
    assert not ran.exists(), "the command ran"


def test_kill_9_during_launch_loses_no_job_and_no_record(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.write()
    for delay in (0.05, 0.15, 0.3, 0.45, 0.6, 0.9):
        launcher = subprocess.Popen([sys.executable, "-m", "gpumon", "run", "--gpu", "0", "--", "sleep", "2"],
                                    env=fake_driver.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        launcher.kill()
        launcher.wait()
    time.sleep(0.5)
    for directory in files.jobs_dir().iterdir() if files.jobs_dir().exists() else []:
        record = json.loads((directory / "job.json").read_text())  # never half-written
        assert record["command"] == ["sleep", "2"]
    for job in job_json(fake_driver):
        assert job["state"] in ("running", "exited", "lost")
        if job["state"] == "lost":
            assert job["pid"] is None  # interrupted before the supervisor started: said so
    running = [j for j in job_json(fake_driver) if j["state"] == "running"]
    for job in running:  # launched jobs run on, and finish normally
        wait_for(lambda: next(j for j in job_json(fake_driver) if j["id"] == job["id"])["state"] == "exited",
                 what="job to finish")


def test_systemd_unavailable_is_a_clear_error(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    result = run_job(fake_driver, "--gpu", "0", "--systemd", "--", "true")
    if result.returncode == 0:
        pytest.skip("a systemd user instance is available here")
    assert result.returncode == 2 and "systemd" in result.stderr and "Traceback" not in result.stderr


def test_select_prints_uuids_for_scripts(fake_driver):
    four_cards(fake_driver.machine)
    fake_driver.write()
    out = fake_driver.run("select", "--count", "2")
    cards = fake_driver.machine.cards
    assert out.stdout.strip() in (f"{cards[2].uuid},{cards[3].uuid}", f"{cards[3].uuid},{cards[2].uuid}")


def test_mig_slices_are_listed_and_pinned_by_mig_uuid(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.machine.cards[1].extra["mig"] = 2
    fake_driver.write()
    table = fake_driver.run("snapshot").stdout
    migs = [word for line in table.splitlines() for word in line.split() if word.startswith("MIG-")]
    assert len(migs) == 2 and "MIG SLICE" in table
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    assert "mig_devices" not in doc["gpus"][1]  # the schema-1 document is unchanged
    result = run_job(fake_driver, "--gpu", migs[1][:20], "--", *env_probe(tmp_path))  # a unique prefix
    assert result.returncode == 0, result.stderr
    assert read_probe(tmp_path)["env"]["CUDA_VISIBLE_DEVICES"] == migs[1]
    (job,) = job_json(fake_driver)
    assert job["gpus"] == [migs[1]] and job["gpu_indices"] == [1]
    bad = run_job(fake_driver, "--gpu", "MIG-ffffffff", "--", "true")
    assert bad.returncode == 2 and "matches no MIG slice" in bad.stderr


def test_mig_job_is_watched_on_its_card(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.machine.cards[0].extra["mig"] = 3
    fake_driver.write()
    mig = next(w for w in fake_driver.run("snapshot").stdout.split() if w.startswith("MIG-"))
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    run_job(fake_driver, "--gpu", mig, "--mem-limit", "1G", "--", sys.executable, "-c", script)
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid"))
    fake_driver.machine.procs.append(dict(gpu=0, pid=pid, mem=2 * GIB))  # listed on the parent card
    fake_driver.write()
    (job,) = wait_for(lambda: [j for j in job_json(fake_driver) if j["state"] == "killed"], what="the watchdog")
    assert job["reason"] == "memory limit exceeded on GPU 0: 2.0 GiB > 1.0 GiB"
