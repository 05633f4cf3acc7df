"""Who records the ledger, and the recording itself (`UsageRecorder.feed`, once per sample).

`gpumon watch` records; the TUI records only where no watch does, so one machine's minutes are
counted once. Both decide with flock(2) on files beside the database, locks that die with their
process (a kill -9 leaves no stale claim):
- `<db>.watch.lock`: a recording watch holds it exclusively for its whole run. A second watch on
  the same file finds it held, says so in one line, and records nothing.
- `<db>.tui.lock`: the one TUI that records holds it (a second TUI, another user's, tries again
  every minute); before adding each sample it asks whether a watch holds the first lock (a
  non-blocking shared lock, released at once: two system calls). While one does, the TUI counts
  nothing and hands over the minute it had, so a watch starting or stopping is never counted twice.

The recorder reads holders from the HolderTracker it is given (the TUI's, which its users view and
`idle` rules read; watch's, shared with its alert engine): a snapshot the tracker has just read is
answered from its cache, so the shares are worked out once per sample.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from gpumon.model import Snapshot
from gpumon.owners.holders import HolderTracker
from gpumon.usage.ledger import LedgerWriter, folder_mode
from gpumon.usage.minutes import MinuteBook
from gpumon.usage.settings import HistorySettings

log = logging.getLogger(__name__)
WATCH_LOCK_TRIES = 50  # a TUI holds the shared probe for microseconds: try a little before giving up
RETRY_TUI_LOCK_S = 60.0


def _lock_file(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True, mode=folder_mode())
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try_lock(fd: int, kind: int) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class UsageRecorder:
    """`role` "watch" or "tui". Nothing it meets (a missing folder, a lock it cannot take, a
    database that fails) is raised: it logs one line and records nothing, or less."""

    def __init__(self, settings: HistorySettings, tracker: HolderTracker, role: str = "watch",
                 clock=time.monotonic) -> None:
        self.settings = settings
        self.tracker = tracker
        self.role = role
        self.book = MinuteBook(settings.period_s, clock)
        self.writer: LedgerWriter | None = None
        self._clock = clock
        self._watch_fd: int | None = None
        self._tui_fd: int | None = None
        self._tui_tried = -RETRY_TUI_LOCK_S
        self.active = False  # recording now (a TUI: while no watch does)

    def start(self) -> UsageRecorder:
        path = self.settings.path
        try:
            self._watch_fd = _lock_file(path.with_name(path.name + ".watch.lock"))
            if self.role == "watch":
                fd = self._watch_fd
                if not any(_try_lock(fd, fcntl.LOCK_EX) or time.sleep(0.01) for _ in range(WATCH_LOCK_TRIES)):
                    log.warning("usage history %s: another gpumon watch records it; this one does not", path)
                    return self._give_up()
                self.active = True
        except OSError as exc:
            log.warning("usage history %s: %s; not recorded, monitoring goes on", path, exc.strerror or exc)
            return self._give_up()
        self.writer = LedgerWriter(path, self.settings.keep_s, legacy=self.settings.legacy_path(),
                                   keep_minutes_s=self.settings.keep_minutes_s)
        return self

    def _give_up(self) -> UsageRecorder:
        self.close()
        self._watch_fd = None
        return self

    def feed(self, snapshot: Snapshot) -> None:
        """One sample (not a stale repeat). Cheap: the writing is the writer thread's. A bug in
        here stops the recording, never the sampling and alerting around it."""
        if self.writer is None or snapshot.stale:
            return
        try:
            self._feed(snapshot, self.writer)
        except Exception as exc:  # a bug of gpumon's: one line, and monitoring goes on
            log.error("usage history %s: stopped recording (internal error: %s: %s)", self.settings.path,
                      type(exc).__name__, exc)
            self.writer.close(timeout=0)
            self.writer = None

    def _feed(self, snapshot: Snapshot, writer: LedgerWriter) -> None:
        if self.role == "tui" and not self._tui_may_record():
            if self.active:  # a watch took over: what was counted before it stays, nothing after
                self.active = False
                self.book.pause()
                if (minute := self.book.take()) is not None:
                    writer.submit(minute)
            return
        self.active = True
        for minute in self.book.add(snapshot, self.tracker.update(snapshot)):
            writer.submit(minute)

    def _tui_may_record(self) -> bool:
        if self._tui_fd is None:
            now = self._clock()
            if now - self._tui_tried < RETRY_TUI_LOCK_S:
                return False
            self._tui_tried = now
            try:
                fd = _lock_file(self.settings.path.with_name(self.settings.path.name + ".tui.lock"))
            except OSError:
                return False
            if not _try_lock(fd, fcntl.LOCK_EX):
                os.close(fd)
                return False
            self._tui_fd = fd
        assert self._watch_fd is not None
        if not _try_lock(self._watch_fd, fcntl.LOCK_SH):
            return False  # a watch records
        fcntl.flock(self._watch_fd, fcntl.LOCK_UN)
        return True

    def close(self) -> None:
        """Write the minute so far and what is queued, then let go of the locks."""
        if self.writer is not None:
            if self.active and (minute := self.book.take()) is not None:
                self.writer.submit(minute)
            self.writer.close()
            self.writer = None
        for fd in (self._watch_fd, self._tui_fd):
            if fd is not None:
                os.close(fd)
        self._watch_fd = self._tui_fd = None
        self.active = False
