"""The host's job event log: each `--failover` move, one JSON line, for `gpumon watch` to report.

Supervisors append to `~/.local/state/gpumon/job-events.<host>.jsonl` (one file per host, as homes
are shared over NFS; one short write with O_APPEND, so lines of concurrent supervisors never mix).
`watch` follows it from where the file ended when it started: a `stat` per sample, and reading
only when the file grew, so it costs nothing while no job moves and never scans job records.
The file is renamed to `….1` (replacing the previous one) when it passes ROTATE_BYTES.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from gpumon.failover_event import FailoverEvent
from gpumon.jobs.files import state_dir
from gpumon.jobs.records import THIS_HOST

log = logging.getLogger(__name__)
ROTATE_BYTES = 1 << 20
READ_LIMIT = 1 << 20  # at most this much new text per call (a burst is read over a few samples)


def event_log(host: str = THIS_HOST) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", host) or "host"
    return state_dir() / f"job-events.{safe}.jsonl"


def append(event: FailoverEvent, path: Path | None = None) -> None:
    """Add one event; a failure to write is logged (the job's own records still say it moved)."""
    path = path or event_log()
    line = (json.dumps(event.to_dict()) + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if path.exists() and path.stat().st_size > ROTATE_BYTES:
            os.replace(path, path.with_name(path.name + ".1"))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("could not add to the job event log %s: %s", path, exc)


class EventFollower:
    """New events since the last call (the first call: since this follower was made)."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or event_log()
        self._inode, self._offset = self._where()
        self._partial = b""

    def _where(self) -> tuple[int | None, int]:
        try:
            st = self.path.stat()
        except OSError:
            return None, 0
        return st.st_ino, st.st_size

    def read_new(self) -> list[FailoverEvent]:
        inode, size = self._where()
        if inode is None or (inode == self._inode and size == self._offset):
            return []  # the common case: one stat, nothing to read
        chunks = []
        if inode != self._inode:  # rotated (or made): the rest of the old file, then the new one
            if self._inode is not None:
                chunks.append(self._read(self.path.with_name(self.path.name + ".1"), self._inode))
            self._inode, self._offset, self._partial = inode, 0, b""
        elif size < self._offset:  # cut short by someone: start again from its beginning
            self._offset, self._partial = 0, b""
        chunks.append(self._read(self.path, inode))
        return [event for chunk in chunks for event in _parse(chunk)]

    def _read(self, path: Path, inode: int) -> bytes:
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_ino != inode:
                    return b""
                f.seek(self._offset)
                data = f.read(READ_LIMIT)
        except OSError:
            return b""
        self._offset += len(data)
        data, self._partial = self._partial + data, b""
        complete, _, rest = data.rpartition(b"\n")
        self._partial = rest  # a line still being written: kept for the next call
        return complete


def _parse(text: bytes) -> list[FailoverEvent]:
    events = []
    for line in text.splitlines():
        try:
            events.append(FailoverEvent.from_dict(json.loads(line)))
        except (ValueError, TypeError, KeyError, AttributeError):
            log.warning("job event log: a line that is not an event was skipped")
    return events
