"""Starting and stopping a job: its supervisor started detached (own session, no terminal), the
wait until its command runs, and a stop that signals only the process that was recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from gpumon.errors import UsageError
from gpumon.jobs.child_gpumon import child_argv
from gpumon.jobs.files import write_atomic
from gpumon.jobs.processes import ActionError, signal_process
from gpumon.jobs.records import FINISHED, STOP_RECORD, Job, alive, load_job


def supervisor_command(directory: Path) -> list[str]:
    """The supervisor of the job in `directory`: this gpumon's, whatever directory it starts in
    (jobs/child_gpumon.py)."""
    return child_argv("gpumon.jobs.supervision.supervisor", [os.path.abspath(directory)])


def start_supervisor(directory: Path, foreground: bool = False,
                     env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start the job's supervisor (with `env`, the environment the job gets; default this one's).
    Detached: own session, no terminal, stdin from /dev/null. `pass_fds`: the job's claims
    (jobs/claims_and_queue.py), which the supervisor holds from then on."""
    command = supervisor_command(directory)
    # In its job folder, not the caller's directory (the job itself runs in the one it was given).
    if foreground:
        return subprocess.Popen(command + ["--foreground"], env=env, cwd=directory, pass_fds=pass_fds)
    with open(os.devnull, "rb") as devnull, open(directory / "supervisor.log", "ab") as log:
        os.chmod(directory / "supervisor.log", 0o600)
        return subprocess.Popen(command, stdin=devnull, stdout=log, stderr=log, start_new_session=True,
                                close_fds=True, env=env, cwd=directory, pass_fds=pass_fds)


def wait_until_started(directory: Path, timeout: float = 10.0) -> Job | None:
    """The job once its command runs, is queued, or has ended; None if that takes too long."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = load_job(directory)
        # A job that is not meant to wait is "queued" only for the moment before its command starts.
        if job is not None and (job.pid is not None or (job.state in FINISHED and job.state != "lost")
                                or (job.state == "queued" and job.spec.wait)):
            return job
        time.sleep(0.05)
    return load_job(directory)


def stop(job: Job) -> str:
    """Ask the supervisor to stop the job: SIGTERM to the command, SIGKILL after its grace period.
    Every signal goes to the process that was recorded (pid *and* start time), never to a pid the
    kernel has given to someone else since."""
    if job.state not in ("running", "queued"):
        raise UsageError(f"job {job.spec.id} is {job.state}, not running")
    if job.remote:
        raise UsageError(f"job {job.spec.id} runs on {job.host}; stop it there: "
                         f"ssh {job.host} gpumon jobs --stop {job.spec.id}")
    if alive(job.supervisor_pid, job.supervisor_started, job.supervisor_booted):
        try:
            signal_process(job.supervisor_pid, job.supervisor_started, signal.SIGTERM, booted=job.supervisor_booted)
            return f"stopping job {job.spec.id}"
        except ActionError:
            pass  # it ended just now: the command may be left
    # No supervisor (it was killed): signal the command's process group ourselves, SIGKILL when
    # asked a second time, and record that the user stopped it.
    if job.pid is not None and alive(job.pid, job.started, job.booted):
        again = (job.dir / STOP_RECORD).exists()
        sig = signal.SIGKILL if again else signal.SIGTERM
        try:
            signal_process(job.pid, job.started, sig, group=True, booted=job.booted)
        except ActionError as exc:
            raise UsageError(f"job {job.spec.id}: {exc}") from None
        write_atomic(job.dir / STOP_RECORD, json.dumps({"time": time.time()}))
        return f"sent {sig.name} to job {job.spec.id} (its supervisor is gone)"
    raise UsageError(f"job {job.spec.id} has no process left to stop")
