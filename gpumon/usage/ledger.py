"""The usage ledger: one SQLite file (the standard library's sqlite3), written off the sampling path.

Tables (one row per period, a minute, of which `minute` is the start in unix seconds):
- `holder_minutes`: per card (`card`: its UUID, or "index:N") per holder (`kind` user, slurm, k8s or
  container, and its `holder` id): seconds held, SM-%-seconds (over `sm_known_s`), byte-seconds
  and peak of GPU memory, joules (its power share), seconds held with 0 % SM.
- `card_minutes`: per card: seconds watched, utilisation-%-seconds, joules, seconds held, busy.

WAL mode (readers never wait for the writer), a busy timeout, and upserts that add to a row, so
two writers (a TUI and a watch handing over, or a restart within a minute) and any number of
readers (`gpumon report`, the web page) share one file. A minute's rows are one transaction.
Rows older than `[history] keep` are deleted at start and every hour.

`LedgerWriter` runs the writes in a daemon thread fed by a bounded queue: a slow disk or a locked
file delays only the thread, and a queue that is full drops a minute rather than block sampling.
A corrupt, locked, read-only or full database is one line in the log (then silence until a write
works again, said in one more line); it never stops monitoring.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from pathlib import Path

from gpumon.units import format_time
from gpumon.usage.minutes import Minute

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
BUSY_TIMEOUT_MS = 5000
QUEUE_MINUTES = 32  # minutes waiting for a disk that does not answer, before one is dropped
PRUNE_EVERY_S = 3600.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS holder_minutes (
  minute INTEGER NOT NULL, host TEXT NOT NULL, card TEXT NOT NULL, kind TEXT NOT NULL, holder TEXT NOT NULL,
  card_index INTEGER NOT NULL, label TEXT NOT NULL, user TEXT,
  held_s REAL NOT NULL, sm_s REAL NOT NULL, sm_known_s REAL NOT NULL, mem_s REAL NOT NULL, mem_peak INTEGER,
  energy_j REAL NOT NULL, idle_s REAL NOT NULL,
  PRIMARY KEY (minute, host, card, kind, holder)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS card_minutes (
  minute INTEGER NOT NULL, host TEXT NOT NULL, card TEXT NOT NULL, card_index INTEGER NOT NULL, name TEXT NOT NULL,
  seen_s REAL NOT NULL, util_s REAL NOT NULL, util_known_s REAL NOT NULL, energy_j REAL NOT NULL,
  held_s REAL NOT NULL, busy_s REAL NOT NULL,
  PRIMARY KEY (minute, host, card)) WITHOUT ROWID;
"""

_ADD_HOLDER = """
INSERT INTO holder_minutes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (minute, host, card, kind, holder) DO UPDATE SET
  card_index = excluded.card_index, label = excluded.label, user = excluded.user,
  held_s = held_s + excluded.held_s, sm_s = sm_s + excluded.sm_s, sm_known_s = sm_known_s + excluded.sm_known_s,
  mem_s = mem_s + excluded.mem_s,
  mem_peak = CASE WHEN mem_peak IS NULL OR excluded.mem_peak > mem_peak THEN excluded.mem_peak ELSE mem_peak END,
  energy_j = energy_j + excluded.energy_j, idle_s = idle_s + excluded.idle_s
"""
_ADD_CARD = """
INSERT INTO card_minutes VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (minute, host, card) DO UPDATE SET
  card_index = excluded.card_index, name = excluded.name, seen_s = seen_s + excluded.seen_s,
  util_s = util_s + excluded.util_s, util_known_s = util_known_s + excluded.util_known_s,
  energy_j = energy_j + excluded.energy_j, held_s = held_s + excluded.held_s, busy_s = busy_s + excluded.busy_s
"""


def connect(path: Path, write: bool = False) -> sqlite3.Connection:
    """A connection to the ledger: for writing, the file and its tables are made when missing; for
    reading, a missing file is an error (sqlite3.OperationalError) and nothing is created."""
    if write:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    else:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000,
                               isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        if write:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")  # WAL: a power cut loses the last minute, never the file
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"written by a newer gpumon (schema {version})")
            conn.executescript(SCHEMA)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        else:
            conn.execute("SELECT 1 FROM holder_minutes LIMIT 1")  # a corrupt or foreign file says so here
    except BaseException:
        conn.close()
        raise
    return conn


def write_minute(conn: sqlite3.Connection, minute: Minute) -> None:
    """One minute's rows in one transaction, added to what is there."""
    start = minute.start
    with_rows = [(start, host, card, kind, ident, *row)  # the row's fields are the table's next columns
                 for (host, card, kind, ident), row in minute.holders.items()]
    cards = [(start, host, card, c.card_index, c.name, c.seen_s, c.util_s, c.util_known_s, c.energy_j, c.held_s,
              c.busy_s) for (host, card), c in minute.cards.items()]
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.executemany(_ADD_HOLDER, with_rows)
        conn.executemany(_ADD_CARD, cards)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def prune(conn: sqlite3.Connection, before: float) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("DELETE FROM holder_minutes WHERE minute < ?", (before,))
    conn.execute("DELETE FROM card_minutes WHERE minute < ?", (before,))
    conn.execute("COMMIT")


def describe(exc: BaseException) -> str:
    """An sqlite3 or OS error in words people know."""
    text = str(exc) or type(exc).__name__
    if "not a database" in text or "malformed" in text:
        return f"{text} (the file is damaged: move it away and a new one is started)"
    return text


class LedgerWriter:
    """Writes the minutes it is given, in order, in its own thread."""

    def __init__(self, path: Path, keep_s: float, clock=time.time) -> None:
        self.path = path
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
            if self._conn is None:
                self._conn = connect(self.path, write=True)
            now = self._clock()
            if now - self._pruned_at >= PRUNE_EVERY_S:
                prune(self._conn, now - self.keep_s)
                self._pruned_at = now
            write_minute(self._conn, minute)
        except (sqlite3.Error, OSError) as exc:
            if self._conn is not None:
                self._conn.close()
                self._conn = None  # opened afresh next minute: the file may have been replaced
            self._fail(describe(exc))
            return
        self.written += 1
        if self.failing is not None:
            log.warning("usage history %s: recording again", self.path)
            self.failing = None

    def _fail(self, reason: str) -> None:
        if self.failing is None:
            log.warning("usage history %s: %s; not recorded, monitoring goes on", self.path, reason)
        self.failing = reason
