"""Things a user can do to a process from gpumon: signal it (terminate, kill, interrupt) and read
its environment.

Each returns a result or raises ActionError with a message fit to show on screen; nothing here
raises for an OS refusal. A process is identified by pid *and* start time, so a pid the kernel
recycled since the last sample is never signalled by mistake.
"""

from __future__ import annotations

import os
import signal

import psutil

SIGNALS = {"terminate": signal.SIGTERM, "kill": signal.SIGKILL, "interrupt": signal.SIGINT}
CUDA_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPUMON_JOB_ID", "CUDA_MPS_PIPE_DIRECTORY")


class ActionError(Exception):
    pass


def _same_process(pid: int, started: float | None) -> psutil.Process:
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 1.0:
            raise ActionError(f"pid {pid} is now a different process; not touched")
        return proc
    except psutil.NoSuchProcess:
        raise ActionError(f"process {pid} has already exited") from None
    except psutil.AccessDenied:
        raise ActionError(f"no permission to inspect process {pid}") from None


def send_signal(pid: int, started: float | None, action: str) -> str:
    """Send terminate/kill/interrupt; returns a confirmation line."""
    sig = SIGNALS[action]
    proc = _same_process(pid, started)
    try:
        proc.send_signal(sig)
    except psutil.NoSuchProcess:
        raise ActionError(f"process {pid} has already exited") from None
    except psutil.AccessDenied:
        raise ActionError(f"not permitted to signal process {pid} (it belongs to another user)") from None
    return f"sent {sig.name} to {pid}"


def may_signal(uid: int | None) -> bool:
    """Whether the OS would let us signal a process owned by uid (root may signal anything)."""
    return os.geteuid() == 0 or uid == os.geteuid()


def environment(pid: int, started: float | None) -> dict[str, str]:
    proc = _same_process(pid, started)
    try:
        return proc.environ()
    except psutil.AccessDenied:
        raise ActionError(f"the environment of process {pid} is not readable (another user's process)") from None
    except psutil.NoSuchProcess:
        raise ActionError(f"process {pid} has already exited") from None
