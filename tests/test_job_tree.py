"""Stopping a job reaches the job's processes and nothing else: the supervisor signals its command
only while it is unreaped (its pid and group id still the job's), and what the command started
through handles taken while it ran (jobs/supervision/process_tree.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from conftest import GIB, IN_CI, require_tool
from test_job_lifecycle import job_dir, state_of
from test_jobs import four_cards, job_json, run_job, wait_for


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def end_if_left(pid: int, started: float) -> None:
    """The test's own leftover, by pid and start time."""
    try:
        proc = psutil.Process(pid)
        if abs(proc.create_time() - started) < 0.01:
            proc.kill()
    except psutil.Error:
        pass


def read_pid(path: Path) -> tuple[int, float]:
    pid = int(wait_for(lambda: path.exists() and path.read_text(), what=path.name))
    return pid, psutil.Process(pid).create_time()


# Reaps the job's command in the supervisor as usual, and at that moment, like any process on a busy
# machine might, a new session leader is started that the kernel gives the command's pid (a pid
# namespace of our own lets us choose: ns_last_pid).
REUSE_DRIVER = textwrap.dedent("""
    import json, subprocess, sys
    from pathlib import Path
    from gpumon.jobs import records
    from gpumon.jobs.launch import LaunchRequest, prepare
    from gpumon.jobs.supervision.supervisor import Supervisor
    from gpumon.cards.backends import open_backend

    # The command asks its supervisor to stop it (as `gpumon jobs --stop` does) and waits to be stopped.
    command = [sys.executable, "-c", "import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); "
                                     "time.sleep(60)"]
    backend = open_backend()
    spec = prepare(LaunchRequest(command=command, gpu_spec="0"), backend.sample(), None, {})
    backend.close()
    directory = records.create_job(spec)
    victims = []
    real = subprocess.Popen._handle_exitstatus

    def reaped(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if self.args == command and not victims:
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(self.pid - 1))
            victims.append(subprocess.Popen(["sleep", "60"], start_new_session=True))
            victims.append(self.pid)

    subprocess.Popen._handle_exitstatus = reaped
    Supervisor(directory, foreground=False).run()
    victim, command_pid = victims
    print(json.dumps({"reused": victim.pid == command_pid, "victim": victim.poll(),
                      "exit": json.loads((directory / "exit.json").read_text())}))
    victim.kill()
""")


def test_a_pid_reused_as_the_command_is_reaped_is_not_signalled(fake_driver, tmp_path):
    unshare = require_tool("unshare")
    four_cards(fake_driver.machine)
    fake_driver.write()
    namespace = [unshare, "--user", "--map-root-user", "--pid", "--fork", "--mount-proc"]
    probe = subprocess.run([*namespace, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        reason = f"no user and pid namespace here: {probe.stderr.strip()}"
        pytest.fail(reason) if IN_CI else pytest.skip(reason)
    driver = tmp_path / "driver.py"
    driver.write_text(REUSE_DRIVER)
    # The namespace's first process is its init: when it ends, the kernel ends everything left in it.
    result = subprocess.run([*namespace, sys.executable, str(driver)], env=fake_driver.env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["reused"], "the kernel did not hand out the command's pid again; the test proves nothing"
    assert report["victim"] is None, "the process that got the job's pid after it ended was signalled"
    assert report["exit"]["state"] == "killed" and report["exit"]["signal"] == 15


LEAVES_A_HELPER = """
import os, signal, subprocess, sys, time
helper = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)")
def on_term(*_):
    # Asked to stop, the command starts a helper in its group that shrugs off SIGTERM, and leaves.
    subprocess.Popen([sys.executable, "-c", helper, sys.argv[1]])
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[2], 'w').write(str(os.getpid()))
time.sleep(120)
"""


def test_a_stopped_jobs_group_is_killed_after_its_command_has_ended(fake_driver, tmp_path):
    """The command has ended, but a process of its group is still there at the end of the grace:
    SIGKILL reaches it through the group, which the unreaped command still holds."""
    four_cards(fake_driver.machine)
    fake_driver.write()
    helper_file, command_file = tmp_path / "helper", tmp_path / "command"
    run_job(fake_driver, "--gpu", "0", "--name", "leaves", "--", sys.executable, "-c", LEAVES_A_HELPER,
            str(helper_file), str(command_file))
    read_pid(command_file)
    assert fake_driver.run("jobs", "--stop", "leaves").returncode == 0
    helper = read_pid(helper_file)
    try:
        job = state_of(fake_driver, "killed")
        wait_for(lambda: gone(helper[0]), timeout=10, what="the helper the stopped job left to be killed")
        assert "stopped by the user" in job["reason"]
    finally:
        end_if_left(*helper)


LEAVES_THE_TREE = """
import os, subprocess, sys, time
helper = ("import os, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
          "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(120)")
if os.fork() == 0:  # a middle process starts a helper in a session of its own, then ends when told
    subprocess.Popen([sys.executable, "-c", helper, sys.argv[1]], start_new_session=True)
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.02)
    os._exit(0)
time.sleep(120)
"""


def test_a_process_that_left_the_jobs_tree_is_still_the_jobs(fake_driver, tmp_path):
    """A helper in a session of its own whose parent ended is neither in the command's group nor
    below it; the supervisor saw it while it was, and still counts and stops it."""
    four_cards(fake_driver.machine)
    fake_driver.write()
    helper_file, middle_done = tmp_path / "helper", tmp_path / "middle-done"
    run_job(fake_driver, "--gpu", "0", "--name", "tree", "--", sys.executable, "-c", LEAVES_THE_TREE,
            str(helper_file), str(middle_done))
    helper = read_pid(helper_file)
    try:
        fake_driver.machine.procs = [dict(gpu=0, pid=helper[0], mem=2 * GIB)]
        fake_driver.write()
        # The supervisor counts the helper's memory as the job's: it has seen it in the job's tree.
        wait_for(lambda: job_json(fake_driver)[0]["peak_gpu_memory"] == 2 * GIB, what="the helper counted")
        middle_done.touch()
        command = job_json(fake_driver)[0]["pid"]
        wait_for(lambda: helper[0] not in {p.pid for p in _descendants(command)}, what="the helper to leave the tree")
        assert fake_driver.run("jobs", "--stop", "tree").returncode == 0
        job = state_of(fake_driver, "killed")
        assert "stopped by the user" in job["reason"]
        wait_for(lambda: gone(helper[0]), timeout=10, what="the helper that left the tree to be killed")
        assert (job_dir(job) / "peak").read_text() == str(2 * GIB)
    finally:
        end_if_left(*helper)


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
