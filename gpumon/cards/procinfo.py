"""Adds what the OS knows (user, command line, CPU %, RSS, start time) to the driver's processes.

Each pid is read once per sample, however many cards it uses: CPU % is measured since the previous
reading, so a second reading in the same sample would say 0 (a data-parallel job on two cards).
What never changes for a pid (user, start time, owner) is read once, through psutil. What
changes is read every sample from one file, /proc/PID/stat: CPU time, resident memory, the
process's start (a pid reused by another process starts over) and its name. psutil reads the same
file, but through one call per value costs ten times the read: 25 ms of every sample with 512 GPU
processes. The command line can change (setproctitle: Ray workers, vLLM, uWSGI), so it is read
again when the name changes and otherwise every COMMAND_REFRESH_S. Who owns the process (a Slurm
job, a pod, a container, a unit: owners/reader.py) is read with its user, once; the job a
scheduler mapped a card to is looked up each sample (a stat of a file, when configured). A pid
that cannot be seen (exited, or in another PID namespace) keeps what the driver said, with
user/command None. /proc is where the owners' HostPaths say (--path.procfs).
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from gpumon.cards.procroot import RootProcess
from gpumon.model import GpuSample, ProcessOwner, ProcessSample
from gpumon.owners.containers import container_pid
from gpumon.owners.reader import HostPaths, OwnerReader, container_label, on_mapped_card
from gpumon.owners.slurm_gres import on_allocated_card
from gpumon.sanitize import printable

# A command line that changes without the process name changing is noticed within this long.
COMMAND_REFRESH_S = 15.0


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True, slots=True)
class _Stat:
    """What /proc/PID/stat says that changes while a process runs."""

    name: str  # the kernel's name for it (comm): changes with setproctitle
    cpu_s: float  # user + system CPU seconds so far
    start_ticks: int  # clock ticks after boot it started at: with the pid, which process this is
    rss: int  # resident bytes


def _read_stat(pid: int, procfs: str = "/proc") -> _Stat | None:
    """None: the process is gone (or its stat cannot be read)."""
    try:
        fd = os.open(f"{procfs}/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The name sits in parentheses and may hold spaces and parentheses itself: split at the last ")".
    head, _, rest = data.rpartition(b")")
    fields = rest.split()
    if len(fields) < 22:
        return None
    return _Stat(head.partition(b"(")[2].decode(errors="replace"), (int(fields[11]) + int(fields[12])) / _TICKS_PER_S,
                 int(fields[19]), int(fields[21]) * _PAGE_BYTES)


@dataclass(slots=True)
class _Known:
    process: psutil.Process | RootProcess
    user: str | None
    command: str | None
    started: float
    uid: int | None
    owner: ProcessOwner
    container: str | None
    name: str | None
    command_read_at: float
    start_ticks: int  # from the stat file: a different value means the pid was reused
    cpu_s: float  # CPU seconds at the last reading, and when (monotonic)
    cpu_at: float
    # The owner's reader's `answers` when the owner was read, while a better name of it was being
    # asked (a Slurm array task's, of scontrol, in the background); None: the owner is settled.
    owner_answers: int | None = None
    container_pid: int | None = None  # its pid in a PID namespace of its own


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


class ProcessEnricher:
    def __init__(self, clock=time.monotonic, owners: OwnerReader | None = None, procfs: str | None = None,
                 paths: HostPaths = HostPaths()) -> None:
        """`procfs`: where /proc is (a host's, mounted in a container); else the owners' `paths` say."""
        self._known: dict[int, _Known] = {}
        self._clock = clock
        self.owners = owners or OwnerReader(paths)
        self._procfs = procfs or str(self.owners.paths.procfs)

    def enrich_gpus(self, gpus: tuple[GpuSample, ...], allocations_wait_s: float = 0.0) -> tuple[GpuSample, ...]:
        """Every card's processes, each pid read once; forgets pids no card lists any more. A card
        this node's Slurm gave a job is that job's (`allocations_wait_s`: how long a first answer
        from Slurm is waited for)."""
        pids = {p.pid for gpu in gpus for p in gpu.processes}
        readings = {pid: self._read(pid) for pid in pids}
        self.forget_missing(pids)
        allocated = self.owners.card_allocations(gpus, allocations_wait_s)
        return tuple(
            on_allocated_card(dataclasses.replace(
                gpu, processes=_on_card(tuple(_apply(p, readings[p.pid]) for p in gpu.processes),
                                        self.owners.card_jobs(gpu.index, gpu.uuid)))
                if gpu.processes else gpu, allocated.get(gpu.index))
            for gpu in gpus
        )

    def enrich(self, processes: tuple[ProcessSample, ...]) -> tuple[ProcessSample, ...]:
        """One card's processes (each pid read once)."""
        readings = {pid: self._read(pid) for pid in {p.pid for p in processes}}
        return tuple(_apply(p, readings[p.pid]) for p in processes)

    def _lookup(self, pid: int, stat: _Stat) -> _Known | None:
        """What never changes for this process, read once; None if psutil cannot see it."""
        try:
            proc = psutil.Process(pid) if self._procfs == "/proc" else RootProcess(pid, self._procfs)
            with proc.oneshot():
                user = _user(proc)
                answers = self.owners.answers
                owner = self.owners.read(pid, user)
                return _Known(proc, user, _command_line(proc), proc.create_time(), _uid(proc), owner,
                              container_label(owner), stat.name, self._clock(), stat.start_ticks, stat.cpu_s,
                              time.monotonic(), answers if self.owners.unsettled(owner) else None,
                              container_pid(pid, Path(self._procfs)))
        except psutil.Error:
            return None

    def _settle_owner(self, pid: int, known: _Known) -> None:
        """The owner read again once a name it was waiting for may have come (no sample waits for it)."""
        if known.owner_answers is None or known.owner_answers == self.owners.answers:
            return
        answers = self.owners.answers
        known.owner = self.owners.read(pid, known.user)
        known.container = container_label(known.owner)
        known.owner_answers = answers if self.owners.unsettled(known.owner) else None

    def _read(self, pid: int) -> _Reading | None:
        stat = _read_stat(pid, self._procfs)
        if stat is None:
            self._known.pop(pid, None)
            return None
        known = self._known.get(pid)
        if known is not None and known.start_ticks != stat.start_ticks:
            known = None  # the pid was reused by another process: start over with the new one
        if known is None:
            known = self._lookup(pid, stat)
            if known is None:
                self._known.pop(pid, None)
                return None
            self._known[pid] = known
            # CPU % is measured since the previous reading: unknown the first time a pid is seen.
            return _Reading(known, None, stat.rss)
        now = time.monotonic()
        cpu = 100 * (stat.cpu_s - known.cpu_s) / (now - known.cpu_at) if now > known.cpu_at else 0.0
        known.cpu_s, known.cpu_at = stat.cpu_s, now
        self._refresh_command(known, stat.name)
        self._settle_owner(pid, known)
        return _Reading(known, max(0.0, cpu), stat.rss)

    def _refresh_command(self, known: _Known, name: str) -> None:
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
    return sample.with_host_info(known.user, known.command, reading.cpu_percent, reading.rss, known.started,
                                 known.uid, known.container, known.owner, known.container_pid)


def _on_card(processes: tuple[ProcessSample, ...], jobs: str | None) -> tuple[ProcessSample, ...]:
    """A card's processes, owned by the jobs a scheduler mapped the card to (if it did) where their
    cgroups name no Slurm job."""
    if jobs is None:
        return processes
    return tuple(p if p.owner is not None and p.owner.kind == "slurm" else
                 p.with_host_info(p.user, p.command, p.cpu_percent, p.rss, p.started, p.uid, p.container,
                                  on_mapped_card(p.owner, jobs), p.container_pid)
                 for p in processes)
