"""Ending the processes a test started, by pid: kill each, then wait until all are gone."""

from __future__ import annotations

from collections.abc import Iterable

import psutil


def kill_and_wait(processes: Iterable[psutil.Process], timeout: float) -> None:
    """Processes already gone are passed over; those still there after `timeout` are left."""
    processes = list(processes)
    for proc in processes:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(processes, timeout=timeout)
