"""The supervisor's records, written best effort: a write that fails (the disk is full, the home's
NFS server is away, a quota) never ends the supervisor, which must go on watching the job. The
latest text of each record that could not be written is kept (a record is a whole file: only its
last version matters) and written again at the next sample, and, for a while, before the supervisor
leaves (`flush`): the end of a job is recorded once the disk has room again.

    records = BestEffortWrites(directory)
    records.write("peak", "1073741824")    # False if it is kept for later
    records.retry()                        # at every sample
    records.flush(deadline_s=600)          # before leaving: True once everything is written
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from gpumon.jobs.files import write_atomic

RETRY_S = 1.0  # between tries while leaving


def say(message: str) -> None:
    """A line for supervisor.log, which may be on the very disk that is full: never fails."""
    try:
        print(f"gpumon supervisor: {message}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def mark_log(log: Path, line: str) -> None:
    """Add `line` to the job's output on a line of its own; a failure is only said (a mark is not
    worth the job)."""
    try:
        with open(log, "ab") as out:
            if out.tell() > 0:
                with open(log, "rb") as previous:
                    previous.seek(-1, os.SEEK_END)
                    if previous.read(1) != b"\n":  # the last attempt's output ended mid-line
                        line = "\n" + line
            out.write(line.encode())
    except OSError as exc:
        say(f"cannot mark the log: {exc.strerror or exc}")


class BestEffortWrites:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.pending: dict[str, str] = {}  # record name -> its newest text, not written yet
        self.problem: str | None = None  # why the last write failed, while any is pending

    def write(self, name: str, text: str) -> bool:
        self.pending.pop(name, None)
        try:
            write_atomic(self.dir / name, text)
        except OSError as exc:
            self.pending[name] = text
            if self.problem is None:  # once per spell of failures, not once a second
                say(f"cannot write {name} (kept, written again later): {exc.strerror or exc}")
            self.problem = f"{name}: {exc.strerror or exc}"
            return False
        return True

    def retry(self) -> bool:
        """Write again what is pending; True when nothing is left."""
        for name, text in list(self.pending.items()):
            if not self.write(name, text):
                return False
        if self.problem is not None and not self.pending:
            say("the records are written again")
            self.problem = None
        return True

    def flush(self, deadline_s: float) -> bool:
        """Before the supervisor leaves: try for up to `deadline_s` seconds."""
        deadline = time.monotonic() + deadline_s
        while not self.retry():
            if time.monotonic() >= deadline:
                say(f"gave up writing {', '.join(self.pending)}: {self.problem}")
                return False
            time.sleep(RETRY_S)
        return True
