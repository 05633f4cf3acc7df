"""`--record FILE`: snapshots appended as JSON lines (gzip when FILE ends in .gz), flushed after
every sample so a crash loses at most the sample being written. The file is private (0600)."""

from __future__ import annotations

import gzip
import json
import os
from typing import IO

from gpumon.errors import UsageError
from gpumon.model import Snapshot


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

    def write(self, snapshot: Snapshot) -> None:
        self._file.write(json.dumps(snapshot.to_dict(), separators=(",", ":")).encode() + b"\n")
        self._file.flush()  # for gzip a sync flush: everything so far is readable after a crash
        if self._file is not self._raw:
            self._raw.flush()

    def close(self) -> None:
        self._file.close()
        if self._file is not self._raw:
            self._raw.close()
