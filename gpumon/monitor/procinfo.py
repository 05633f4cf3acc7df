"""Adds what the OS knows (user, command line, CPU %, RSS, start time) to the driver's processes.

psutil.Process objects are kept between samples: CPU % needs the previous reading, and user,
command line and start time never change for a pid, so they are read once. A pid psutil cannot
see (exited, or in another PID namespace) keeps what the driver said, with user/command None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import psutil

from gpumon.model import ProcessSample
from gpumon.monitor.containers import container_of
from gpumon.sanitize import printable


@dataclass(slots=True)
class _Known:
    process: psutil.Process
    user: str | None
    command: str | None
    started: float
    uid: int | None
    container: str | None


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


class ProcessEnricher:
    def __init__(self) -> None:
        self._known: dict[int, _Known] = {}

    def _lookup(self, pid: int) -> tuple[_Known | None, bool]:
        """The cached process for pid, and whether it was already known before this call."""
        known = self._known.get(pid)
        if known is not None:
            return known, True
        try:
            proc = psutil.Process(pid)
            with proc.oneshot():
                known = _Known(proc, _user(proc), _command_line(proc), proc.create_time(),
                               _uid(proc), container_of(pid))
            proc.cpu_percent()  # primes the counter; the first real reading comes next sample
        except psutil.Error:
            return None, False
        self._known[pid] = known
        return known, False

    def enrich(self, processes: tuple[ProcessSample, ...]) -> tuple[ProcessSample, ...]:
        return tuple(self._enrich_one(p) for p in processes)

    def _enrich_one(self, sample: ProcessSample) -> ProcessSample:
        known, seen_before = self._lookup(sample.pid)
        if known is None:
            return sample
        try:
            with known.process.oneshot():
                if seen_before and known.process.create_time() != known.started:
                    # The pid was recycled by another process: start over with the new one.
                    del self._known[sample.pid]
                    return self._enrich_one(sample)
                # CPU % is measured since the previous call: unknown the first time a pid is seen.
                cpu = known.process.cpu_percent() if seen_before else None
                rss = known.process.memory_info().rss
        except psutil.NoSuchProcess:
            self._known.pop(sample.pid, None)
            return sample
        except psutil.Error:
            cpu, rss = None, None
        return dataclasses.replace(
            sample, user=known.user, command=known.command, cpu_percent=cpu, rss=rss,
            started=known.started, uid=known.uid, container=known.container,
        )

    def forget_missing(self, alive: set[int]) -> None:
        """Drop cached processes the driver no longer lists, so the cache stays small."""
        for pid in self._known.keys() - alive:
            del self._known[pid]
