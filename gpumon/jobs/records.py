"""Jobs launched by gpumon: what their records say, and the state read from them (files.py keeps
the files, control.py starts and stops jobs). Each job has a private directory (0700) in the user's state dir:
    ~/.local/state/gpumon/jobs/<id>/
        job.json      what was asked: command, cards, limit, cwd, the environment added
        process.json  the running command's pid and start time (a recycled pid is not the job)
        supervisor.json  the supervisor's pid and start time
        exit.json     how it ended (state, exit code or signal, end time), and why if gpumon stopped it
        attempts.json each start of the command: cards, pid, start, end, why it moved (--failover)
        peak          peak GPU memory the watchdog saw (bytes)
        energy.json   the energy its cards used while it ran (jobs/supervision/energy.py)
        output.log    the command's stdout and stderr
Records are written atomically (temp file + rename): a kill -9 at any moment leaves each one old or
new, never half-written. A small supervisor process (gpumon.jobs.supervision.supervisor) owns each
detached job: it waits for a free card when queued, starts the command, enforces the memory limit,
and records the exit; in its own session, so quitting the TUI or losing the SSH connection does not
touch it. Homes are often shared between hosts (NFS): each job records the host it runs on, and a
job of another host is shown as its records say, never judged by this host's pids (which mean
nothing there), never stopped from here and never pruned while it may run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpumon.config import JOBS_KEEP, JOBS_KEEP_FOR_S
from gpumon.errors import UsageError
from gpumon.jobs.attempts import Attempt, load_attempts
from gpumon.jobs.container_processes import recorded_processes
from gpumon.jobs.files import WAITING_RECORD, jobs_dir, read_json, unusable_folder, write_atomic
from gpumon.jobs.processes import same_start

STATES = ("queued", "running", "exited", "failed", "cancelled", "killed", "lost")
FINISHED = ("exited", "failed", "cancelled", "killed", "lost")
THIS_HOST = socket.gethostname()


STOP_RECORD = "stop.json"  # `jobs --stop` of a job whose supervisor is gone
# A running job whose supervisor is gone, as tables show it (`state` stays "running" in the JSON,
# with "supervised": false, so readers that know the seven states keep working).
UNSUPERVISED = "unsupervised"
# The command has ended; the supervisor holds its end record until the state folder takes it (a full
# disk, an NFS server away): the job is not over for prune or --stop, but nothing runs.
RECORD_PENDING = "its command has ended; record pending: gpumon's supervisor writes how once the state folder has room"
UNSUPERVISED_REASON = ("gpumon's supervisor is gone while the command runs: no memory limit, no failover, "
                       "no end record (stop it with gpumon jobs --stop)")


@dataclass
class JobSpec:
    """What the user asked for; written once to job.json (cards filled in when they are chosen)."""

    id: str
    name: str
    command: list[str]
    gpu_spec: str
    cwd: str
    created: float
    gpus: list[str] = field(default_factory=list)
    gpu_indices: list[int] = field(default_factory=list)
    mem_limit: int | None = None  # the job's own limit (--mem-limit), on each of its cards
    numa: bool = True
    wait: bool = False
    min_free: str | None = None
    max_util: float | None = None
    backend: dict[str, Any] = field(default_factory=dict)  # open_backend() arguments for the supervisor
    interval: float = 1.0  # seconds between the supervisor's samples (waiting, watchdog)
    env_added: dict[str, str] = field(default_factory=dict)
    cpus: list[int] | None = None
    limits_applied: list[str] = field(default_factory=list)
    host: str = ""  # where the job runs ("" in records older than the field: this host)
    failover: int = 0  # how many times the job may move to other cards when its card fails
    # The limit on each card of the attempt (by UUID, as `gpus`): the job's own, or the card's default
    # (`m`); filled in by the supervisor when it starts the command. Cards without one are left out.
    mem_limits: dict[str, int] = field(default_factory=dict)

    @property
    def limits(self) -> dict[str, int]:
        """The limit on each card, also for records from before `mem_limits` (`mem_limit` on all)."""
        if self.mem_limits:
            return dict(self.mem_limits)
        return {uuid: self.mem_limit for uuid in self.gpus} if self.mem_limit else {}

    @property
    def limit(self) -> int | None:
        """One limit for the tables and `mem_limit`: the job's own, else the strictest card's."""
        return self.mem_limit or min(self.limits.values(), default=None)
    claims_dir: str | None = None  # the host's shared place for claims and the queue (gpumon/sharing)
    # The config file `gpumon run --config` read, which the supervisor reads too (its [health.xid]
    # policy); None: the one the supervisor finds itself ($GPUMON_CONFIG, else the default).
    config: str | None = None
    wait_timeout: float | None = None  # --wait-timeout: seconds a queued job waits before giving up
    as_typed: bool = False  # --as-typed: a container command's own request for cards is kept
    # Where the command starts a container: its engine, what gpumon added (jobs/container_command.py).
    container: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass
class Job:
    """A job as `gpumon jobs` shows it: the spec plus what happened."""

    spec: JobSpec
    dir: Path
    state: str
    pid: int | None = None
    started: float | None = None
    ended: float | None = None
    exit_code: int | None = None
    reason: str | None = None
    peak_gpu_memory: int | None = None
    supervisor_pid: int | None = None
    supervisor_started: float | None = None
    signal: str | None = None  # the signal that ended the command: "SIGKILL"
    # Seconds after boot at which the command and the supervisor started (None in older records):
    # what identifies them even after the clock was stepped.
    booted: float | None = None
    supervisor_booted: float | None = None
    attempts: list[Attempt] = field(default_factory=list)
    energy_j: float | None = None  # what its cards used while it ran; energy_shared: others used them too
    energy_shared: bool | None = None
    # Whether gpumon's supervisor still watches the running or queued job: False when it is gone
    # while the command runs (no limit, no failover, no end record); None when finished, or when
    # only another host can tell.
    supervised: bool | None = None

    @property
    def host(self) -> str:
        return self.spec.host or THIS_HOST

    @property
    def remote(self) -> bool:
        """Runs on another host that shares this home: its pids mean nothing here."""
        return self.host != THIS_HOST

    @property
    def state_text(self) -> str:
        """The state for people: another host's unfinished job says where it runs; a running job whose
        supervisor is gone is `unsupervised`."""
        if self.supervised is False:
            return UNSUPERVISED
        if self.reason == RECORD_PENDING:  # "running" to scripts until its end is recorded; not to people
            return "ended"
        return f"{self.state} on {self.host}" if self.remote and self.state not in FINISHED else self.state

    @property
    def log(self) -> Path:
        return self.dir / "output.log"

    @property
    def runtime(self) -> float | None:
        """Seconds the command has run (until now if it still runs); None before it starts."""
        if self.started is None:
            return None
        return (self.ended or time.time()) - self.started

    def to_dict(self) -> dict[str, Any]:
        """The `gpumon jobs --json` entry of docs/design.md."""
        s = self.spec
        return {
            "id": s.id, "name": s.name, "command": s.command, "gpus": s.gpus, "gpu_indices": s.gpu_indices,
            "host": self.host, "state": self.state, "pid": self.pid, "exit_code": self.exit_code,
            "signal": self.signal, "started": self.started,
            "ended": self.ended, "log": str(self.log), "mem_limit": s.limit,
            "mem_limits": s.limits,
            "peak_gpu_memory": self.peak_gpu_memory, "reason": self.reason,
            "failover": s.failover, "attempts": [a.to_dict() for a in self.attempts],
            "energy_j": self.energy_j, "energy_shared": self.energy_shared,
            "runs_on": self.host if self.remote else None, "supervised": self.supervised,
        }

    def processes(self) -> list[psutil.Process]:
        """The job's command and everything it started, if it is running (on this host)."""
        if self.state != "running" or self.pid is None or self.remote:
            return []
        inside = recorded_processes(self.dir) if self.spec.container else []  # not its children
        try:
            root = psutil.Process(self.pid)
            if not same_start(root, self.started, self.booted):
                return inside
            return [root] + root.children(recursive=True) + inside
        except psutil.Error:
            return inside


def alive(pid: int | None, started: float | None, booted: float | None = None) -> bool:
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if not same_start(proc, started, booted):
            return False  # the pid was recycled by another process
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _signal_name(number: Any) -> str | None:
    try:
        return signal.Signals(int(number)).name
    except (TypeError, ValueError):
        return None


def _ended_state(ended: dict[str, Any], reason: str | None) -> str:
    state = ended.get("state")
    if state in FINISHED:
        return state
    return "killed" if ended.get("signal") or reason else "exited"  # records written before "state"


def load_job(directory: Path) -> Job | None:
    data = read_json(directory / "job.json")
    if data is None:
        return None
    try:
        spec = JobSpec.from_dict(data)
    except TypeError:
        return None
    process = read_json(directory / "process.json") or {}
    supervisor = read_json(directory / "supervisor.json") or {}
    ended = read_json(directory / "exit.json")
    job = Job(spec, directory, "lost", pid=process.get("pid"), started=process.get("started"),
              booted=process.get("booted"), supervisor_pid=supervisor.get("pid"),
              supervisor_started=supervisor.get("started"), supervisor_booted=supervisor.get("booted"))
    try:
        job.peak_gpu_memory = int((directory / "peak").read_text())
    except (OSError, ValueError):
        pass
    job.attempts = load_attempts(directory)
    energy = read_json(directory / "energy.json") or {}  # written by jobs/supervision/energy.py as the job ends
    joules = energy.get("energy_j")
    job.energy_j = float(joules) if isinstance(joules, (int, float)) and not isinstance(joules, bool) else None
    job.energy_shared = energy.get("energy_shared") if isinstance(energy.get("energy_shared"), bool) else None
    if ended is not None:
        job.ended = ended.get("ended")
        job.exit_code = ended.get("exit_code")
        job.reason = ended.get("reason")
        job.signal = _signal_name(ended.get("signal"))
        job.state = _ended_state(ended, job.reason)
    elif job.remote:
        # Another host's job: what its records say; only that host can tell whether it still runs.
        job.state = "running" if job.pid is not None else "queued"
    elif alive(job.pid, job.started, job.booted):
        job.state = "running"
        job.supervised = alive(job.supervisor_pid, job.supervisor_started, job.supervisor_booted)
        if not job.supervised:
            job.reason = UNSUPERVISED_REASON
    elif alive(job.supervisor_pid, job.supervisor_started, job.supervisor_booted):
        # Waiting for a card, or the command just ended and the supervisor is recording it.
        job.state, job.supervised = ("queued" if job.pid is None else "running"), True
        if job.pid is not None and not (spec.container or {}).get("detached"):  # `run -d`: its container runs
            job.reason = RECORD_PENDING
        if job.pid is None and job.attempts and job.attempts[-1].moved_because:  # --failover: between cards
            job.reason = f"waiting for free cards to move to, after {job.attempts[-1].moved_because}"
        elif job.pid is None:  # queued: why, as its supervisor says
            job.reason = str((read_json(directory / WAITING_RECORD) or {}).get("reason") or "")[:300] or None
    elif (stopped := read_json(directory / STOP_RECORD)) is not None:
        job.state, job.ended = "killed", stopped.get("time")
        job.reason = "stopped by the user (gpumon's supervisor was gone: exit status unknown)"
    else:
        job.reason = "gpumon's supervisor is gone and the command is no longer running; exit status unknown" \
            if job.pid else "never started (the launch was interrupted)"
    return job


def list_jobs() -> list[Job]:
    """All jobs, oldest first."""
    root = jobs_dir()
    try:
        folders = [d for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
    except OSError as exc:
        raise unusable_folder(root, exc, "read the job records") from None
    jobs = [job for d in folders if (job := load_job(d)) is not None]
    return sorted(jobs, key=lambda j: (j.spec.created, j.spec.id))


SHOWN_MATCHES = 5  # an ambiguous job id lists this many of the jobs it matches


def find_job(ident: str) -> Job:
    """The job with this id, any unique part of it (people copy the end, `591e` of
    `20261201-140412-591e`, which is what differs), or this name."""
    if not ident.strip():
        raise UsageError("empty job id: give the id of a job, or a part of it (`gpumon jobs` lists them)")
    listed = list_jobs()
    matches = [j for j in listed if j.spec.id == ident] or [
        j for j in listed if ident in j.spec.id or j.spec.name == ident]
    if not matches:
        raise UsageError(f"no job {ident!r} (`gpumon jobs` lists them)")
    if len(matches) > 1:
        shown = ", ".join(f"{j.spec.id} ({j.spec.name})" for j in matches[-SHOWN_MATCHES:])
        more = f" and {len(matches) - SHOWN_MATCHES} older" if len(matches) > SHOWN_MATCHES else ""
        raise UsageError(f"{ident!r} matches {len(matches)} jobs: {shown}{more}; give more of the id")
    return matches[0]


def prune() -> list[Job]:
    """Remove the records of finished jobs; returns them. Another host's unfinished jobs are kept:
    from here they cannot be known to be over."""
    removed = []
    for job in list_jobs():
        if job.state in FINISHED:
            shutil.rmtree(job.dir, ignore_errors=True)
            removed.append(job)
    return removed


@dataclass(frozen=True)
class JobsKeep:
    """The config's [jobs] keep and keep_for: finished jobs kept (the newest), and for how long."""

    count: int = JOBS_KEEP
    for_s: float = JOBS_KEEP_FOR_S


def prune_old(keep: int = JOBS_KEEP, keep_for: float = JOBS_KEEP_FOR_S, now: float | None = None) -> list[Job]:
    """Remove the records of finished jobs beyond the newest `keep`, and of those that ended over
    `keep_for` seconds ago; returns them. Unfinished jobs, and another host's, are never removed here."""
    now = time.time() if now is None else now
    finished = [job for job in list_jobs() if job.state in FINISHED and not job.remote]
    removed = []
    for position, job in enumerate(reversed(finished)):  # newest first
        ended = job.ended if isinstance(job.ended, (int, float)) else job.spec.created
        if position >= keep or now - ended > keep_for:
            shutil.rmtree(job.dir, ignore_errors=True)
            removed.append(job)
    return removed


def new_job_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(2).hex()


def create_job(spec: JobSpec, keep: JobsKeep = JobsKeep()) -> Path:
    prune_old(keep.count, keep.for_s)  # each new job makes room: the records stay as many as [jobs] keep says
    directory = jobs_dir() / spec.id
    try:
        directory.mkdir(parents=True, mode=0o700)
        os.chmod(directory, 0o700)
        write_atomic(directory / "job.json", json.dumps(asdict(spec), indent=1))
        os.close(os.open(directory / "output.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    except OSError as exc:  # not left half-recorded (it would list as never started), unless another job's
        if not isinstance(exc, FileExistsError):
            shutil.rmtree(directory, ignore_errors=True)
        raise unusable_folder(jobs_dir(), exc, "record the job") from None
    return directory


def record_failure(directory: Path, reason: str) -> None:
    """The job could not be started at all (its supervisor records everything after that)."""
    write_atomic(directory / "exit.json", json.dumps({"state": "failed", "exit_code": None, "signal": None,
                                                      "ended": time.time(), "reason": reason}))


