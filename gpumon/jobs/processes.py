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


# A process's start is counted in clock ticks since boot, so it never changes; a pid reused even a
# moment later starts at least a tick (10 ms) apart.
SAME_START_S = 0.005


def since_boot(proc: psutil.Process) -> float:
    """When the process started, in seconds since boot: unlike its start as a date (psutil adds the
    boot time, which moves when the clock is stepped), this never changes while the machine runs."""
    return proc.create_time() - psutil.boot_time()


def same_start(proc: psutil.Process, started: float | None, booted: float | None = None) -> bool:
    """Whether `proc` is the process recorded as starting at `started` (a date) — or, when the
    record has it, `booted` seconds after boot, which survives a stepped clock."""
    if booted is not None:
        return abs(since_boot(proc) - booted) <= SAME_START_S
    return started is None or abs(proc.create_time() - started) <= SAME_START_S


class ActionError(Exception):
    pass


def _same_process(pid: int, started: float | None, booted: float | None = None) -> psutil.Process:
    try:
        proc = psutil.Process(pid)
        if not same_start(proc, started, booted):
            raise ActionError(f"pid {pid} is now a different process; not touched")
        return proc
    except psutil.NoSuchProcess:
        raise ActionError(f"process {pid} has already exited") from None
    except psutil.AccessDenied:
        raise ActionError(f"no permission to inspect process {pid}") from None


def signal_process(pid: int, started: float | None, sig: int, group: bool = False,
                   booted: float | None = None) -> None:
    """Send `sig` to the process `pid` that started at `started` (to its process group when
    `group`: a job's command leads its own). Every signal gpumon sends goes through here."""
    proc = _same_process(pid, started, booted)
    try:
        if group:
            if os.getpgid(pid) != pid:
                raise ActionError(f"process {pid} no longer leads its process group; not touched")
            os.killpg(pid, sig)
        else:
            proc.send_signal(sig)  # psutil checks the start time again right before the kill
    except (psutil.NoSuchProcess, ProcessLookupError):
        raise ActionError(f"process {pid} has already exited") from None
    except (psutil.AccessDenied, PermissionError):
        raise ActionError(f"not permitted to signal process {pid} (it belongs to another user)") from None


def send_signal(pid: int, started: float | None, action: str) -> str:
    """Send terminate/kill/interrupt; returns a confirmation line."""
    sig = SIGNALS[action]
    signal_process(pid, started, sig)
    return f"sent {sig.name} to {pid}"


_KERNEL_THREAD = 0x00200000  # PF_KTHREAD in /proc/PID/stat's flags


def system_process(pid: int) -> str | None:
    """Why signalling `pid` could take down the machine or someone's login, or None: PID 1, a
    kernel thread, another user's session leader (their login shell, sshd's session, a daemon).
    Only a process named with its start time (as a view that shows it does) is signalled then."""
    if pid == 1:
        return "it is PID 1 (the system's init)"
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
        if int(fields[6]) & _KERNEL_THREAD:
            return "it is a kernel thread"
    except (OSError, ValueError, IndexError):
        pass
    try:
        proc = psutil.Process(pid)
        uid = proc.uids().real
        leads = os.getsid(pid) == pid
        user = proc.username()
    except (psutil.Error, OSError, KeyError):
        return None
    if leads and uid != os.geteuid():
        return f"it leads a session of {user} (a login or a service)"
    return None


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
