"""`gpumon jobs --log ID [--follow]`: a job's output, and with --follow what it writes next.

Following ends when the job has ended and its last output is out, when stdout closes, or when
stdin (a pipe or socket: over ssh, the connection) closes, so a log followed from another host
leaves nothing behind when that host stops watching.
"""

from __future__ import annotations

import os
import select
from typing import BinaryIO

from gpumon.errors import EXIT_OK
from gpumon.jobs.records import Job, load_job
from gpumon.remote.connection import stdin_connection

POLL_S = 0.25
CHUNK = 1 << 16


def _copy_new(path, offset: int, out: BinaryIO) -> int:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while chunk := f.read(CHUNK):
                out.write(chunk)
                offset += len(chunk)
    except FileNotFoundError:
        pass
    out.flush()
    return offset


def print_log(job: Job, out: BinaryIO, follow: bool = False) -> int:
    offset = _copy_new(job.log, 0, out)
    stdin = stdin_connection() if follow else None
    while follow:
        current = load_job(job.dir)
        finished = current is None or current.state not in ("running", "queued")
        offset = _copy_new(job.log, offset, out)
        if finished:
            break
        if stdin is None:
            select.select([], [], [], POLL_S)
            continue
        ready, _, _ = select.select([stdin], [], [], POLL_S)
        if ready and not os.read(stdin, CHUNK):
            break  # the other end is gone
    return EXIT_OK
