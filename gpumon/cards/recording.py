"""Recordings: `--record FILE` appends every snapshot as a JSON line (gzip when FILE ends in .gz),
flushed after every sample so a crash loses at most the sample being written; the file is private
(0600). A write that fails (a full disk) stops the recording and is reported once by the caller;
monitoring and alerting go on. `read_recording` reads one back for `--replay`: a bad line (a crash
mid-write leaves a truncated last line) is skipped with a warning."""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Iterator
from typing import IO

from gpumon.errors import UsageError
from gpumon.model import Snapshot

log = logging.getLogger(__name__)


class Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            raise UsageError(f"cannot write recording {path}: {exc.strerror}") from None
        raw = os.fdopen(fd, "ab")
        self._file: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="ab") if path.endswith(".gz") else raw
        self._raw = raw
        self.failed: str | None = None

    def write(self, snapshot: Snapshot) -> str | None:
        """Append one snapshot. Never raises: the first failure stops the recording and is
        returned (once) for the caller to report; later calls do nothing."""
        if self.failed is not None:
            return None
        try:
            self._file.write(json.dumps(snapshot.to_dict(), separators=(",", ":")).encode() + b"\n")
            self._file.flush()  # for gzip a sync flush: everything so far is readable after a crash
            if self._file is not self._raw:
                self._raw.flush()
        except OSError as exc:
            self.failed = f"cannot write recording {self.path}: {exc.strerror or exc}; recording stopped"
            return self.failed
        return None

    def close(self) -> None:
        for f in (self._file, self._raw) if self._file is not self._raw else (self._raw,):
            try:
                f.close()
            except OSError:  # the failure was reported when it happened
                pass


def read_recording(path: str) -> Iterator[Snapshot]:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            read = 0
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    snapshot = Snapshot.from_dict(json.loads(line), backend="replay")
                except (ValueError, TypeError, KeyError, AttributeError) as exc:
                    if not read:  # not a recording at all: one line, not one per line of it
                        raise UsageError(f"{path} is not a gpumon recording (line {number} is no snapshot: "
                                         f"{exc})") from None
                    log.warning("%s:%d: skipped unreadable snapshot (%s)", path, number, exc)
                    continue
                read += 1
                yield snapshot
    except (OSError, EOFError) as exc:
        raise UsageError(f"cannot read recording {path}: {exc}") from None
