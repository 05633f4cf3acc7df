"""Launching a job: one path for `gpumon run` and the TUI's `r` dialog.

`prepare` turns a request into a JobSpec (or a UsageError naming the bad part) against the current
snapshot; `start` records it and hands it to its supervisor; `run_in_terminal` is the foreground
path (the TUI suspends itself around it). A command line typed into the TUI runs in the user's
shell (`shell_request`), so pipes, `&&` and `VAR=value` work as they do at a prompt.

A job gets the environment of whoever launched it: the shell's for `gpumon run` (also under
`--systemd`, whose user manager has an environment of its own), and for the TUI the environment
gpumon was started with, not the one it changed for itself (NO_COLOR, COLUMNS, ...).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpumon.cards.backends import Backend
from gpumon.cards.sampler import sample_once
from gpumon.errors import UsageError
from gpumon.jobs import command_history, control, files
from gpumon.jobs import records as jobs
from gpumon.jobs.claims_and_queue import CardsTaken, LaunchSharing, notes_for, queue_request
from gpumon.jobs.container_command import OtherCards, check_cards, locate
from gpumon.jobs.limits import card_limits  # noqa: F401 - the TUI's dialogs read the defaults here
from gpumon.jobs.naming import command_line_name, program_name
from gpumon.jobs.placement import (
    allocated_elsewhere,
    auto_count,
    busy_note,
    never_met,
    outside_allocation,
    resolve_spec,
)
from gpumon.model import GpuSample, Snapshot, Topology
from gpumon.owners.reader import HostPaths
from gpumon.sharing.folder import SharingSettings
from gpumon.units import format_bytes, format_cpu_list, parse_size

# How many times a job launched with the run dialog's "move if the card fails" may move.
DIALOG_FAILOVER = 3


@dataclass
class LaunchRequest:
    command: list[str]
    gpu_spec: str = "auto"
    mem_limit: str | None = None  # SIZE as typed; % of the smallest chosen card
    numa: bool = True
    foreground: bool = False
    name: str | None = None
    wait: bool = False
    min_free: str | None = None
    max_util: float | None = None
    cwd: str | None = None
    systemd: bool = False
    typed: str | None = None  # the command line as the user typed it (the TUI), for history
    failover: int = 0  # moves to other cards allowed when the job's card fails
    # How often its supervisor samples its cards, for a launch through a host's `gpumon run`
    # (jobs/host.py): the TUI's --interval. None: that gpumon's own (--interval, config, 1 s).
    interval: float | None = None
    wait_timeout: float | None = None  # --wait-timeout: a queued job gives up after this many seconds
    as_typed: bool = False  # a container command's own request for other cards is kept (with a warning)


def shell_request(typed: str, gpu_spec: str, **options: Any) -> LaunchRequest:
    """A command line the user typed: it runs in their shell, exactly as typed."""
    return LaunchRequest(command=["/bin/sh", "-c", typed], gpu_spec=gpu_spec, typed=typed,
                         name=command_line_name(typed), **options)


def prepare(request: LaunchRequest, snapshot: Snapshot, topo: Topology | None, backend_args: dict[str, Any],
            interval: float = 1.0, taken: CardsTaken | None = None) -> jobs.JobSpec:
    if not request.command or not request.command[0].strip():
        raise UsageError("no command given: gpumon run [OPTIONS] -- CMD [ARG...]")
    cwd = os.path.abspath(os.path.expanduser(request.cwd or os.getcwd()))
    if not os.path.isdir(cwd):
        raise UsageError(f"working directory does not exist: {cwd}")
    # Bad SPECs fail now, even for queued jobs; free-enough conditions wait for --wait.
    free_min = None if request.wait else request.min_free
    free_util = None if request.wait else request.max_util
    taken = taken or CardsTaken()
    # Inside a Slurm job or a container: auto and the queue choose among the cards it grants.
    outside = outside_allocation(snapshot, os.environ)
    # On a Slurm node: not the cards Slurm has given its other jobs.
    allocated = allocated_elsewhere(snapshot, os.environ)
    if request.wait and (never := never_met(request.gpu_spec, snapshot, request.min_free, outside, allocated)):
        raise UsageError(f"cannot queue: {never}; it would wait for good, and every queued job behind it too")
    gpus = resolve_spec(request.gpu_spec, snapshot, topo, free_min, free_util, None,
                        {**outside, **allocated, **taken.skip},
                        taken.mine) if not (request.wait and request.gpu_spec.startswith("auto")) else []
    limit = None
    if request.mem_limit:
        totals = ([g.memory_total for g in gpus if g.memory_total]
                  or [g.memory_total for g in snapshot.gpus if g.memory_total])
        limit = parse_size(request.mem_limit, min(totals) if totals else None)
        _check_limit(request.mem_limit, limit, gpus or snapshot.gpus, chosen=bool(gpus))
    if (located := locate(request.command)) is not None:
        try:  # a container that asks its engine for other cards would see cards nobody gave it
            check_cards(located.container, [g.ref or "" for g in gpus], [g.index for g in gpus], request.as_typed)
        except OtherCards as exc:
            raise UsageError(str(exc)) from None
    # Without one, each card the job lands on brings its own default: its supervisor applies them.
    name = request.name or program_name(request.command)
    return jobs.JobSpec(
        id=jobs.new_job_id(), name=name, command=list(request.command), gpu_spec=request.gpu_spec, cwd=cwd,
        created=time.time(), gpus=[g.ref for g in gpus] if not request.wait else [],
        gpu_indices=[g.index for g in gpus] if not request.wait else [], mem_limit=limit, numa=request.numa,
        wait=request.wait, min_free=request.min_free, max_util=request.max_util,
        backend=_absolute_paths(backend_args), interval=interval, host=jobs.THIS_HOST,
        failover=request.failover, wait_timeout=request.wait_timeout, as_typed=request.as_typed,
    )


BACKEND_PATHS = ("nvml_lib", "sysfs", "procfs")


def _absolute_paths(backend_args: dict[str, Any]) -> dict[str, Any]:
    """How the supervisor opens the cards, its paths absolute: it runs in the job's folder."""
    return {k: os.path.abspath(v) if k in BACKEND_PATHS and isinstance(v, str) and os.sep in v else v
            for k, v in backend_args.items() if v is not None}


def _check_limit(typed: str, limit: int, gpus: Sequence[GpuSample], chosen: bool) -> None:
    """A cap above a card's memory caps nothing: a typo (200G for 20G) or the wrong card. Each
    chosen card must hold it; a job queued for whichever card frees up needs only one that can."""
    over = [g for g in gpus if g.memory_total and limit > g.memory_total]
    if chosen and over:
        g = over[0]
        raise UsageError(f"--mem-limit {typed} is more than GPU {g.index}'s memory ({format_bytes(g.memory_total)})")
    if not chosen and over and len(over) == len([g for g in gpus if g.memory_total]):
        largest = max(g.memory_total for g in over)
        raise UsageError(f"--mem-limit {typed} is more than any card's memory (the largest has "
                         f"{format_bytes(largest)})")


def systemd_available() -> bool:
    if not shutil.which("systemd-run"):
        return False
    probe = subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True, timeout=10)
    return probe.returncode == 0


def start(spec: jobs.JobSpec, foreground: bool = False, systemd: bool = False, typed: str | None = None,
          env: Mapping[str, str] | None = None, pass_fds: tuple[int, ...] = (),
          keep: jobs.JobsKeep = jobs.JobsKeep()) -> Path:
    """Record the job and start its supervisor (not in the foreground: the caller does that, see
    `run_foreground`); returns the job's directory. `env`: the job's environment (default ours);
    `pass_fds`: its claims, handed to the supervisor (systemd's starts without: it claims anew);
    `keep`: how many finished jobs' records are kept ([jobs])."""
    if systemd and not systemd_available():
        raise UsageError("--systemd: no systemd user instance is reachable here (systemctl --user failed)")
    directory = jobs.create_job(spec, keep)
    command_history.remember_command(typed or shlex.join(spec.command))
    if systemd:
        files.save_environment(directory, dict(os.environ if env is None else env))
        started = subprocess.run(["systemd-run", "--user", "--collect", "--quiet", f"--unit=gpumon-job-{spec.id}",
                                  f"--property=WorkingDirectory={directory}",
                                  *control.supervisor_command(directory)], capture_output=True, text=True)
        if started.returncode != 0:
            files.take_environment(directory)  # nobody will read it
            reason = (started.stderr.strip().splitlines() or [f"exit status {started.returncode}"])[-1]
            jobs.record_failure(directory, f"systemd-run failed: {reason}")
            raise UsageError(f"--systemd: systemd-run failed: {reason}")
    elif not foreground:
        control.start_supervisor(directory, env=None if env is None else dict(env), pass_fds=pass_fds)
    return directory


def run_foreground(directory: Path, env: Mapping[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> int:
    """Run the job's supervisor in this terminal and wait for it. Ctrl-C reaches the job (and the
    supervisor, which records the end); gpumon itself ignores it meanwhile, or it would leave
    before the job does, and the TUI would crash behind it."""
    # Ignored from before the start: the supervisor inherits that until it has its own handler, so a
    # Ctrl-C while it starts up cannot kill it before it can record anything.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        return control.start_supervisor(directory, foreground=True, env=None if env is None else dict(env),
                                        pass_fds=pass_fds).wait()
    finally:
        signal.signal(signal.SIGINT, previous)


def summary(job: jobs.Job) -> list[str]:
    s = job.spec
    cards = ", ".join(f"GPU {i} ({u[:12]}…)" for i, u in zip(s.gpu_indices, s.gpus)) or f"'{s.gpu_spec}' when free"
    lines = []
    if job.state == "queued":
        lines.append(f"job {s.id} ({s.name}) queued: waits for {cards}")
    elif job.pid is not None:
        lines.append(f"job {s.id} ({s.name}) on {cards}, pid {job.pid}")
    else:
        lines.append(f"job {s.id} ({s.name}) {job.state}: {job.reason or ''}".rstrip(": "))
    if s.container:
        lines.append(str(s.container.get("summary", "")))
    if s.cpus:
        lines.append(f"CPUs: {format_cpu_list(s.cpus)} (the cards' NUMA node)")
    if s.limits:
        lines.append(f"memory limit {_limits_text(s)}: {', '.join(s.limits_applied) or 'watchdog'}")
    elif s.mem_limit:  # queued: on the cards it will get
        lines.append(f"memory limit {format_bytes(s.mem_limit)} per card: watchdog")
    if s.failover:
        lines.append(f"failover: moves to other cards if its card fails, up to {s.failover} time"
                     + ("s" if s.failover != 1 else ""))
    lines.append(f"log: {job.log}")
    return lines


def _limits_text(spec: jobs.JobSpec) -> str:
    """'8.0G per card', or each card's when they differ: 'GPU 0 8.0G, GPU 1 4.0G (per card)'."""
    limits = spec.limits
    if len(set(limits.values())) == 1 and len(limits) == len(spec.gpus):
        return f"{format_bytes(spec.limit)} per card"
    by_index = dict(zip(spec.gpus, spec.gpu_indices))
    return ", ".join(f"GPU {by_index.get(uuid, '?')} {format_bytes(limit)}" for uuid, limit in limits.items()) \
        + " (per card)"


def run_in_terminal(where: str, command: str, run: Callable[[], int],
                    how_it_ended: Callable[[int], str] = lambda code: f"exited with status {code}") -> int:
    """The TUI's Foreground, on this machine or another: `run()` runs the job in this terminal (the
    caller has given it up) until it ends, then Enter is awaited so its last output can be read."""
    print(f"gpumon: running on {where}: {command}", flush=True)
    code = run()
    try:
        input(f"\ngpumon: the job {how_it_ended(code)}. Press Enter to return to gpumon. ")
    except EOFError:
        pass
    return code


def how_it_ended(job: Mapping[str, Any] | None, code: int) -> str:
    """A foreground job's end, for the line under its output, as its record (its Jobs JSON entry)
    says: the exit status alone cannot tell a Ctrl-C from `exit 130`."""
    if job and job.get("signal"):
        return f"was stopped by {job['signal']}"
    if job and job.get("state") == "cancelled":  # Ctrl-C before its command started
        return f"was cancelled before it started ({job.get('reason') or 'by the user'})"
    return f"exited with status {code}"


def launch(request: LaunchRequest, backend: Backend, backend_args: dict[str, Any], interval: float,
           out: IO[str], as_json: bool = False, shared: SharingSettings | None = None,
           keep: jobs.JobsKeep = jobs.JobsKeep(), config_file: str | None = None,
           owners: HostPaths = HostPaths()) -> int:
    """`gpumon run`: what it started, for people, or (`as_json`, what a host's `run` answers to the
    gpumon that asked, jobs/host.py) `{"job": <its jobs --json entry>, "summary": [those lines]}`.
    `shared`: the host's shared place ([claims]; None: the defaults); `keep`: [jobs] keep; `config_file`: the one given
    with --config, handed to the supervisor; `owners`: where the host's records of who runs what are."""
    snapshot = sample_once(backend, owners=owners)
    needs_topo = (auto_count(request.gpu_spec) or 1) > 1
    topo = backend.topology() if needs_topo else None
    sharing = LaunchSharing(shared or SharingSettings(), lambda line: print(f"gpumon: {line}", file=sys.stderr))
    auto = request.gpu_spec.strip().startswith("auto") and not request.wait
    # Claimed as they are chosen: a rival launch's claim on one of them sends this one to choose again.
    spec, taken, hold = sharing.claim_chosen(
        lambda seen: prepare(request, snapshot, topo, backend_args, interval, seen), auto=auto, queued=request.wait)
    spec.claims_dir = str(sharing.directory)
    spec.config = os.path.abspath(config_file) if config_file else None
    if request.wait:
        named = [] if auto_count(request.gpu_spec) else [g.ref for g in resolve_spec(request.gpu_spec, snapshot)]
        try:
            hold.items += sharing.enqueue(spec.id, spec.name, spec.gpu_spec,
                                          *queue_request(spec.gpu_spec, request.min_free, named)).items
        except UsageError:
            hold.release()
            raise
    try:
        if not request.wait and not request.gpu_spec.startswith("auto"):  # auto picks free cards; --wait waits
            chosen = [g for g in snapshot.gpus if g.ref in spec.gpus]
            for note in notes_for(chosen, taken):
                print(f"gpumon: {note}; starting there as asked (the card is shared)", file=sys.stderr)
            for gpu in chosen:
                if why := outside_allocation(snapshot, os.environ).get(gpu.ref or ""):
                    print(f"gpumon: GPU {gpu.index} is {why}: the job may not be able to open it; starting there "
                          "as asked", file=sys.stderr)
                if why := allocated_elsewhere(snapshot, os.environ).get(gpu.ref or ""):
                    print(f"gpumon: GPU {gpu.index} is {why}; starting there as asked (the card is shared)",
                          file=sys.stderr)
            for gpu in chosen:
                if note := busy_note(gpu):
                    print(f"gpumon: {note}; starting there as asked", file=sys.stderr)
        directory = start(spec, foreground=request.foreground, systemd=request.systemd, typed=request.typed,
                          pass_fds=hold.fds, keep=keep)
        if request.foreground:
            return run_foreground(directory, pass_fds=hold.fds)
        job = control.wait_until_started(directory)
        if job is not None and job.state == "queued" and request.wait_timeout is not None:
            job = _wait_in_queue(directory, request.wait_timeout)
    finally:
        hold.close()  # the supervisor holds them now
    if job is None:
        raise UsageError(f"job {spec.id} did not start; see {directory}/supervisor.log")
    if job.state == "failed" and request.wait_timeout is not None and job.spec.wait:
        print(f"gpumon: job {spec.id} ({spec.name}) {job.reason}", file=sys.stderr)
        if as_json:
            out.write(json.dumps({"job": job.to_dict(), "summary": summary(job)}) + "\n")
        return 1
    code = 0 if job.state in ("running", "queued", "exited") else 1
    if not as_json:
        out.writelines(line + "\n" for line in summary(job))
        return code
    out.write(json.dumps({"job": job.to_dict(), "summary": summary(job)}) + "\n")
    if code:  # what the asking gpumon says (its stdout is for the machine)
        print(f"gpumon: job {spec.id} {job.state}: {job.reason or 'see ' + str(job.log)}", file=sys.stderr)
    return code


def _wait_in_queue(directory: Path, timeout: float) -> jobs.Job | None:
    """With --wait-timeout, `run` waits for its queued job to start or give up (its supervisor
    gives up at the timeout and records why)."""
    deadline = time.monotonic() + timeout + 30.0
    while time.monotonic() < deadline:
        job = jobs.load_job(directory)
        if job is None or job.state != "queued":
            return control.wait_until_started(directory) if job is not None and job.state == "running" else job
        time.sleep(0.1)
    return jobs.load_job(directory)
