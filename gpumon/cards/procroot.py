"""A process read from a /proc mounted somewhere else (a host's, in a container): the few things
procinfo asks psutil, read from that root. psutil reads one root for the whole program
(psutil.PROCFS_PATH), and gpumon's own processes (jobs, supervisors) are in this one."""

from __future__ import annotations

import contextlib
import os
import pwd
from collections.abc import Iterator
from typing import NamedTuple

import psutil

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


class _Uids(NamedTuple):
    real: int
    effective: int
    saved: int


class RootProcess:
    """The subset of psutil.Process that procinfo uses, for process `pid` under `procfs`."""

    def __init__(self, pid: int, procfs: str) -> None:
        self.pid = pid
        self._base = f"{procfs}/{pid}"
        self._procfs = procfs
        self._stat = self._read("stat")  # raises NoSuchProcess now if it is gone, as psutil does

    def _read(self, name: str) -> bytes:
        try:
            with open(f"{self._base}/{name}", "rb") as file:
                return file.read()
        except FileNotFoundError:
            raise psutil.NoSuchProcess(self.pid) from None
        except OSError:
            raise psutil.AccessDenied(self.pid) from None

    @contextlib.contextmanager
    def oneshot(self) -> Iterator[None]:
        yield

    def name(self) -> str:
        return self._stat.partition(b"(")[2].rpartition(b")")[0].decode(errors="replace")

    def cmdline(self) -> list[str]:
        return [a.decode(errors="replace") for a in self._read("cmdline").split(b"\0") if a]

    def uids(self) -> _Uids:
        for line in self._read("status").splitlines():
            if line.startswith(b"Uid:"):
                real, effective, saved = (int(x) for x in line.split()[1:4])
                return _Uids(real, effective, saved)
        raise psutil.AccessDenied(self.pid)

    def username(self) -> str:
        return pwd.getpwuid(self.uids().real).pw_name  # KeyError without a passwd entry, as psutil

    def create_time(self) -> float:
        ticks = int(self._stat.rpartition(b")")[2].split()[19])
        with open(f"{self._procfs}/stat", "rb") as file:
            boot = next(int(line.split()[1]) for line in file if line.startswith(b"btime"))
        return boot + ticks / _TICKS_PER_S
