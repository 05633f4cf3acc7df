"""Holds the claims `gpumon select --claim` made, for as long as one process lives (the shell that
ran it): `python -m gpumon.jobs.claim_holder DIR JOB PID STARTED`, handed the claims' descriptors.

Detached (its own session, no terminal, nothing on the shell's pipes, so `eval "$(gpumon select
--claim --export)"` returns at once), it waits for that process to end (a pidfd where the kernel has
one, else a look each second), making again any claim someone removes meanwhile, and then lets the
claims go. Killed, it lets them go too: a claim is an flock, which ends with its last holder.
"""

from __future__ import annotations

import os
import select
import sys
import time
from pathlib import Path

import psutil

from gpumon.sharing import claims

LOOK_EVERY_S = 1.0


def alive(pid: int, started: float) -> bool:
    try:
        return abs(psutil.Process(pid).create_time() - started) < 0.01
    except psutil.Error:
        return False


def hold_until_gone(directory: Path, job: str, pid: int, started: float) -> None:
    held = claims.adopt(directory, job)
    try:
        waiter = os.pidfd_open(pid)
    except (AttributeError, OSError):
        waiter = None
    try:
        while alive(pid, started):
            if waiter is not None:
                select.select([waiter], [], [], LOOK_EVERY_S)
            else:
                time.sleep(LOOK_EVERY_S)
            held.make_again(directory)  # the folder's owner removed one
    finally:
        held.release()
        if waiter is not None:
            os.close(waiter)


def main(argv: list[str]) -> int:
    directory, job, pid, started = argv
    try:
        hold_until_gone(Path(directory), job, int(pid), float(started))
    except Exception:  # noqa: BLE001 - nobody reads its output; the claims end with it either way
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
