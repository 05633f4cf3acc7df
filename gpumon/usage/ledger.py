"""The usage ledger: one SQLite file (the standard library's sqlite3), written off the sampling path.
Its tables, rollups and upgrade are store.py's; here, how the file is opened and the thread that
writes it.

A rollback journal (`journal_mode = DELETE`), not WAL: a reader needs nothing but read access to
the file (WAL's readers need its `-shm` file, which another user cannot make in root's folder once
the writer has stopped and SQLite has removed it), it works on NFS (WAL's shared memory does not),
and a file moved away leaves nothing behind under its old name. Readers and the writer wait for each
other only while one reads (a report: under a second) or writes (a minute: milliseconds), within
the busy timeout. Upserts add to a row, so two writers (a TUI and a watch handing over, or a
restart within a minute) and any number of readers (`gpumon report`, the web page) share one file.
A minute's rows are one transaction. Rows older than `[history] keep` are deleted at start and
every hour. A file moved away or deleted while it is written is noticed at the next minute
(its inode is not the path's any more) and a new one started.

Root's ledger is everyone's to read (a folder it makes is 0755, the file 0644 under the usual
umask); an ordinary user's stays theirs (0700).

`LedgerWriter` runs the writes in a daemon thread fed by a bounded queue: a slow disk or a locked
file delays only the thread, and a queue that is full drops a minute rather than block sampling.
A corrupt, locked, read-only or full database is one line in the log (then silence until a write
works again, said in one more line); it never stops monitoring.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path

from gpumon.units import format_time
from gpumon.usage import store
from gpumon.usage.minutes import Minute

log = logging.getLogger(__name__)
BUSY_TIMEOUT_MS = 5000
QUEUE_MINUTES = 32  # minutes waiting for a disk that does not answer, before one is dropped
PRUNE_EVERY_S = 3600.0


def connect(path: Path, write: bool = False) -> sqlite3.Connection:
    """A connection to the ledger: for writing, the file and its tables are made when missing; for
    reading, a missing file is an error (sqlite3.OperationalError) and nothing is created."""
    if write:
        path.parent.mkdir(parents=True, exist_ok=True, mode=folder_mode())
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    else:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if write:
            if conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] != "delete":
                raise sqlite3.OperationalError("database is locked (another program reads it in WAL mode)")
            store.create(conn)
        else:
            conn.execute("SELECT 1 FROM holder_minutes LIMIT 1")  # a corrupt or foreign file says so here
    except BaseException:
        conn.close()
        raise
    return conn


def folder_mode() -> int:
    """Root's ledger (the system's, of every user) is for everyone to read; a user's is theirs."""
    return 0o755 if os.geteuid() == 0 else 0o700


def describe(exc: BaseException) -> str:
    """An sqlite3 or OS error in words people know."""
    text = str(exc) or type(exc).__name__
    if "not a database" in text or "malformed" in text:
        return f"{text} (the file is damaged: move it away and a new one is started)"
    return text


class LedgerWriter:
    """Writes the minutes it is given, in order, in its own thread."""

    def __init__(self, path: Path, keep_s: float, clock=time.time, legacy: Path | None = None,
                 keep_minutes_s: float = store.KEEP_MINUTES_S) -> None:
        self.path = path
        self.keep_minutes_s = keep_minutes_s
        self._ids = store.Ids()
        self.legacy = legacy  # the file this one was called before: renamed to it if it is not there yet
        self._file: tuple[int, int] | None = None  # (st_dev, st_ino) of the file the connection writes
        self.keep_s = keep_s
        self._clock = clock
        self._queue: queue.Queue[Minute | None] = queue.Queue(maxsize=QUEUE_MINUTES)
        self._conn: sqlite3.Connection | None = None
        self._pruned_at = 0.0
        self.failing: str | None = None  # what went wrong last, until a write works again
        self.written = 0  # minutes written (tests and the benchmark wait on it)
        self._thread = threading.Thread(target=self._run, name="gpumon-usage", daemon=True)
        self._thread.start()

    def submit(self, minute: Minute) -> None:
        try:
            self._queue.put_nowait(minute)
        except queue.Full:
            at = format_time(minute.start)
            self._fail(f"the disk is not keeping up: the minute from {at} is not recorded")

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued (up to `timeout`), then stop."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            minute = self._queue.get()
            if minute is None:
                break
            self._write(minute)
        if self._conn is not None:
            self._conn.close()

    def _write(self, minute: Minute) -> None:
        try:
            if self._conn is not None and not self._still_there():
                self._conn.close()
                self._conn = None
                self._pruned_at = 0.0
                log.warning("usage history %s: the file was moved away or deleted; a new one is started", self.path)
            if self._conn is None:
                self._open()
            now = self._clock()
            if now - self._pruned_at >= PRUNE_EVERY_S:
                store.prune(self._conn, now - self.keep_s)
                self._ids = store.Ids()  # a card or holder no row names any more is gone
                store.roll_up(self._conn, now - self.keep_minutes_s)
                self._pruned_at = now
            store.write_minute(self._conn, minute, self._ids)
        except (sqlite3.Error, OSError) as exc:
            self._ids = store.Ids()
            if self._conn is not None:
                self._conn.close()
                self._conn = None  # opened afresh next minute: the file may have been replaced
            self._fail(describe(exc))
            return
        self.written += 1
        if self.failing is not None:
            log.warning("usage history %s: recording again", self.path)
            self.failing = None

    def _open(self) -> None:
        if self.legacy is not None and not self.path.exists() and self.legacy.exists():
            try:  # its journal first, so that what it holds goes with it
                for suffix in ("-wal", "-shm", "-journal"):
                    if Path(f"{self.legacy}{suffix}").exists():
                        os.rename(f"{self.legacy}{suffix}", f"{self.path}{suffix}")
                self.legacy.rename(self.path)
            except FileNotFoundError:
                pass  # another host's writer took it first
        self._conn = connect(self.path, write=True)
        self._ids = store.Ids()
        info = os.stat(self.path)
        self._file = (info.st_dev, info.st_ino)

    def _still_there(self) -> bool:
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            return False
        return (info.st_dev, info.st_ino) == self._file

    def _fail(self, reason: str) -> None:
        if self.failing is None:
            log.warning("usage history %s: %s; not recorded, monitoring goes on", self.path, reason)
        self.failing = reason
