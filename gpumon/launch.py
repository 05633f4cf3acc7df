"""Launching a job: one path for `gpumon run` and the TUI's `r` dialog.

`prepare` turns a request into a JobSpec (or a UsageError naming the bad part) against the current
snapshot; `start` records it and hands it to its supervisor.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpumon import jobs
from gpumon.backends import Backend
from gpumon.errors import UsageError
from gpumon.limits import CardLimits
from gpumon.model import Snapshot, Topology
from gpumon.pinning import resolve_spec
from gpumon.units import format_bytes, parse_size


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


def card_limits() -> CardLimits:
    return CardLimits(jobs.state_dir() / "card-limits.json")


def prepare(request: LaunchRequest, snapshot: Snapshot, topo: Topology | None, backend_args: dict[str, Any],
            interval: float = 1.0) -> jobs.JobSpec:
    if not request.command or not request.command[0].strip():
        raise UsageError("no command given: gpumon run [OPTIONS] -- CMD [ARG...]")
    cwd = os.path.abspath(os.path.expanduser(request.cwd or os.getcwd()))
    if not os.path.isdir(cwd):
        raise UsageError(f"working directory does not exist: {cwd}")
    # Bad SPECs fail now, even for queued jobs; free-enough conditions wait for --wait.
    free_min = None if request.wait else request.min_free
    free_util = None if request.wait else request.max_util
    gpus = resolve_spec(request.gpu_spec, snapshot, topo, free_min, free_util) if not (
        request.wait and request.gpu_spec.startswith("auto")) else []
    limit = None
    if request.mem_limit:
        totals = [g.memory_total for g in gpus if g.memory_total] or [g.memory_total for g in snapshot.gpus if g.memory_total]
        limit = parse_size(request.mem_limit, min(totals) if totals else None)
    elif len(gpus) == 1:
        limit = card_limits().get(gpus[0].uuid)  # the card's default, set with `m` in the TUI
    name = request.name or os.path.basename(request.command[0])
    return jobs.JobSpec(
        id=jobs.new_job_id(), name=name, command=list(request.command), gpu_spec=request.gpu_spec, cwd=cwd,
        created=time.time(), gpus=[g.uuid for g in gpus] if not request.wait else [],
        gpu_indices=[g.index for g in gpus] if not request.wait else [], mem_limit=limit, numa=request.numa,
        wait=request.wait, min_free=request.min_free, max_util=request.max_util,
        backend={k: v for k, v in backend_args.items() if v is not None}, interval=interval,
    )


def systemd_available() -> bool:
    if not shutil.which("systemd-run"):
        return False
    probe = subprocess.run(["systemctl", "--user", "show-environment"], capture_output=True, timeout=10)
    return probe.returncode == 0


def start(spec: jobs.JobSpec, foreground: bool = False, systemd: bool = False) -> Path:
    """Record the job and start its supervisor; returns the job's directory."""
    if systemd and not systemd_available():
        raise UsageError("--systemd: no systemd user instance is reachable here (systemctl --user failed)")
    directory = jobs.create_job(spec)
    jobs.remember_command(shlex.join(spec.command))
    if systemd:
        subprocess.run(["systemd-run", "--user", "--collect", "--quiet", f"--unit=gpumon-job-{spec.id}",
                        sys.executable, "-m", "gpumon.supervisor", str(directory)], check=True)
    elif not foreground:
        jobs.start_supervisor(directory)
    return directory


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
    if s.cpus:
        from gpumon.units import format_cpu_list
        lines.append(f"CPUs: {format_cpu_list(s.cpus)} (the cards' NUMA node)")
    if s.mem_limit:
        lines.append(f"memory limit {format_bytes(s.mem_limit)} per card: {', '.join(s.limits_applied) or 'watchdog'}")
    lines.append(f"log: {job.log}")
    return lines


def launch(request: LaunchRequest, backend: Backend, backend_args: dict[str, Any], interval: float,
           out: IO[str]) -> int:
    from gpumon.sampler import sample_once

    snapshot = sample_once(backend)
    needs_topo = request.gpu_spec.startswith("auto:") and request.gpu_spec != "auto:1"
    spec = prepare(request, snapshot, backend.topology() if needs_topo else None, backend_args, interval)
    directory = start(spec, foreground=request.foreground, systemd=request.systemd)
    if request.foreground:
        supervisor = jobs.start_supervisor(directory, foreground=True)
        return supervisor.wait()
    job = jobs.wait_until_started(directory)
    if job is None:
        raise UsageError(f"job {spec.id} did not start; see {directory}/supervisor.log")
    for line in summary(job):
        out.write(line + "\n")
    return 0 if job.state in ("running", "queued", "exited") else 1
