"""Adds what the OS knows (user, command line, CPU %, RSS, start time) to the driver's processes.

Each pid is read once per sample, however many cards it uses: CPU % is measured since the previous
reading, so a second reading in the same sample would say 0 (a data-parallel job on two cards).
psutil.Process objects are kept between samples. User and start time never change for a pid; the
command line can (setproctitle: Ray workers, vLLM, uWSGI), so it is read again when the process's
name changes (a free signal: the name comes with the stat file read for CPU times anyway) and
otherwise every COMMAND_REFRESH_S. A pid psutil cannot see (exited, or in another PID namespace)
keeps what the driver said, with user/command None.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import psutil

from gpumon.model import GpuSample, ProcessSample
from gpumon.monitor.containers import container_of
from gpumon.sanitize import printable

# A command line that changes without the process name changing is noticed within this long.
COMMAND_REFRESH_S = 15.0


@dataclass(slots=True)
class _Known:
    process: psutil.Process
    user: str | None
    command: str | None
    started: float
    uid: int | None
    container: str | None
    name: str | None  # the kernel's name for it (comm): changes with setproctitle
    command_read_at: float


@dataclass(frozen=True, slots=True)
class _Reading:
    """One sample's reading of one pid."""

    known: _Known
    cpu_percent: float | None
    rss: int | None


def _command_line(proc: psutil.Process) -> str | None:
    try:
        argv = proc.cmdline()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        argv = []
    if argv:
        return printable(" ".join(argv))
    try:
        return printable(f"[{proc.name()}]")
    except psutil.Error:
        return None


def _user(proc: psutil.Process) -> str | None:
    try:
        return printable(proc.username())
    except KeyError:  # uid with no passwd entry (container, LDAP down)
        try:
            return str(proc.uids().real)
        except psutil.Error:
            return None
    except psutil.Error:
        return None


def _uid(proc: psutil.Process) -> int | None:
    try:
        return proc.uids().real
    except psutil.Error:
        return None


def _name(proc: psutil.Process) -> str | None:
    try:
        return proc.name()
    except psutil.Error:
        return None


class ProcessEnricher:
    def __init__(self, clock=time.monotonic) -> None:
        self._known: dict[int, _Known] = {}
        self._clock = clock

    def enrich_gpus(self, gpus: tuple[GpuSample, ...]) -> tuple[GpuSample, ...]:
        """Every card's processes, each pid read once; forgets pids no card lists any more."""
        pids = {p.pid for gpu in gpus for p in gpu.processes}
        readings = {pid: self._read(pid) for pid in pids}
        self.forget_missing(pids)
        return tuple(
            dataclasses.replace(gpu, processes=tuple(_apply(p, readings[p.pid]) for p in gpu.processes))
            if gpu.processes else gpu
            for gpu in gpus
        )

    def enrich(self, processes: tuple[ProcessSample, ...]) -> tuple[ProcessSample, ...]:
        """One card's processes (each pid read once)."""
        readings = {pid: self._read(pid) for pid in {p.pid for p in processes}}
        return tuple(_apply(p, readings[p.pid]) for p in processes)

    def _lookup(self, pid: int) -> tuple[_Known | None, bool]:
        """The cached process for pid, and whether it was already known before this call."""
        known = self._known.get(pid)
        if known is not None:
            return known, True
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                known = _Known(proc, _user(proc), _command_line(proc), proc.create_time(),
                               _uid(proc), container_of(pid), _name(proc), self._clock())
            proc.cpu_percent()  # primes the counter; the first real reading comes next sample
        except psutil.Error:
            return None, False
        self._known[pid] = known
        return known, False

    def _read(self, pid: int) -> _Reading | None:
        known, seen_before = self._lookup(pid)
        if known is None:
            return None
        proc = known.process
        try:
            with proc.oneshot():
                if seen_before and proc.create_time() != known.started:
                    # The pid was recycled by another process: start over with the new one.
                    del self._known[pid]
                    return self._read(pid)
                # CPU % is measured since the previous call: unknown the first time a pid is seen.
                cpu = proc.cpu_percent() if seen_before else None
                rss = proc.memory_info().rss
                if seen_before:
                    self._refresh_command(known)
        except psutil.NoSuchProcess:
            self._known.pop(pid, None)
            return None
        except psutil.Error:
            cpu, rss = None, None
        return _Reading(known, cpu, rss)

    def _refresh_command(self, known: _Known) -> None:
        """Inside oneshot(): the name comes from the stat file CPU times were read from."""
        name = _name(known.process)
        now = self._clock()
        if name != known.name or now - known.command_read_at >= COMMAND_REFRESH_S:
            known.name, known.command_read_at = name, now
            known.command = _command_line(known.process)

    def forget_missing(self, alive: set[int]) -> None:
        """Drop cached processes the driver no longer lists, so the cache stays small."""
        for pid in self._known.keys() - alive:
            del self._known[pid]


def _apply(sample: ProcessSample, reading: _Reading | None) -> ProcessSample:
    if reading is None:
        return sample
    known = reading.known
    return dataclasses.replace(
        sample, user=known.user, command=known.command, cpu_percent=reading.cpu_percent, rss=reading.rss,
        started=known.started, uid=known.uid, container=known.container,
    )
