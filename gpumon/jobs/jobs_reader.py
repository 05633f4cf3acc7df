"""The job list read again cheaply, for views that list the jobs every second (the J screen)."""

from __future__ import annotations

import os
from pathlib import Path

from gpumon.jobs.files import jobs_dir
from gpumon.jobs.records import FINISHED, Job, load_job


class JobsReader:
    """The job list, read again cheaply: a finished job whose directory has not changed (every
    record is written by a rename into it, which changes the directory) is not read again; only
    unfinished jobs (whose state also depends on their processes) and changed ones are. `read()`
    costs a stat per job plus the unfinished ones, not every record of every job ever made;
    `changed` says whether the last read found anything new (a view skips its redraw)."""

    def __init__(self) -> None:
        self._known: dict[str, tuple[int, Job]] = {}  # directory name -> (its mtime, the finished job)
        self._last: list[Job] = []
        self.changed = True

    def read(self) -> list[Job]:
        """All jobs, oldest first (as list_jobs)."""
        root = jobs_dir()
        try:
            entries = [e for e in os.scandir(root) if e.is_dir()]
        except FileNotFoundError:
            entries = []
        known: dict[str, tuple[int, Job]] = {}
        jobs: list[Job] = []
        for entry in entries:
            try:
                mtime = entry.stat().st_mtime_ns
            except OSError:
                continue
            cached = self._known.get(entry.name)
            job = cached[1] if cached is not None and cached[0] == mtime else load_job(Path(entry.path))
            if job is None:
                continue
            if job.state in FINISHED:
                known[entry.name] = (mtime, job)
            jobs.append(job)
        jobs.sort(key=lambda j: (j.spec.created, j.spec.id))
        self.changed = [_shown(j) for j in jobs] != [_shown(j) for j in self._last]
        self._known, self._last = known, jobs
        return jobs


def _shown(job: Job) -> tuple:
    return (job.spec.id, job.state, job.pid, job.ended, job.exit_code, job.reason, job.peak_gpu_memory,
            len(job.attempts))
