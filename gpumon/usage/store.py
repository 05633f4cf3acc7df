"""The ledger's tables (format 2), how a minute is written into them, how old minutes are rolled up
into hours, and how a format-1 file is upgraded in place.

    cards(id, host, card, card_index, name, last_held, last_busy)   one row per card ever written
    holders(id, kind, holder, label, user)                           one row per holder
    holder_minutes / holder_hours(minute, card, holder, held_s, sm_s, sm_known_s, mem_s, mem_peak,
                                  energy_j, idle_s)
    card_minutes / card_hours(minute, card, seen_s, util_s, util_known_s, energy_j, held_s, busy_s)
    meta(key, value)   'rolled_before': minutes before this are in the hour tables

Rows name their card and holder by id (a UUID and a user name once, not in every row). Minutes are
kept `[history] keep_minutes` (2 days), then added up into one row per hour (`minute` its start),
as Prometheus' recording rules and RRD's consolidation do: a year is a few hundred thousand rows.
A card's last use is kept on its row as minutes are written, so no report scans the history for it.
"""

from __future__ import annotations

import sqlite3

from gpumon.usage.minutes import Minute

SCHEMA_VERSION = 2
HOUR_S = 3600
KEEP_MINUTES_S = 2 * 86400.0
_SUMS_H = "held_s REAL NOT NULL, sm_s REAL NOT NULL, sm_known_s REAL NOT NULL, mem_s REAL NOT NULL, " \
          "mem_peak INTEGER, energy_j REAL NOT NULL, idle_s REAL NOT NULL"
_SUMS_C = "seen_s REAL NOT NULL, util_s REAL NOT NULL, util_known_s REAL NOT NULL, energy_j REAL NOT NULL, " \
          "held_s REAL NOT NULL, busy_s REAL NOT NULL"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS cards (id INTEGER PRIMARY KEY, host TEXT NOT NULL, card TEXT NOT NULL,
  card_index INTEGER NOT NULL, name TEXT NOT NULL, last_held INTEGER, last_busy INTEGER, UNIQUE (host, card));
CREATE TABLE IF NOT EXISTS holders (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, holder TEXT NOT NULL,
  label TEXT NOT NULL, user TEXT, UNIQUE (kind, holder));
CREATE TABLE IF NOT EXISTS holder_minutes (minute INTEGER NOT NULL, card INTEGER NOT NULL, holder INTEGER NOT NULL,
  {_SUMS_H}, PRIMARY KEY (minute, card, holder)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS holder_hours (minute INTEGER NOT NULL, card INTEGER NOT NULL, holder INTEGER NOT NULL,
  {_SUMS_H}, PRIMARY KEY (minute, card, holder)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS card_minutes (minute INTEGER NOT NULL, card INTEGER NOT NULL, {_SUMS_C},
  PRIMARY KEY (minute, card)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS card_hours (minute INTEGER NOT NULL, card INTEGER NOT NULL, {_SUMS_C},
  PRIMARY KEY (minute, card)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID;
"""

_ADD_HOLDER = """
INSERT INTO {table} VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (minute, card, holder) DO UPDATE SET
  held_s = held_s + excluded.held_s, sm_s = sm_s + excluded.sm_s, sm_known_s = sm_known_s + excluded.sm_known_s,
  mem_s = mem_s + excluded.mem_s,
  mem_peak = CASE WHEN mem_peak IS NULL OR excluded.mem_peak > mem_peak THEN excluded.mem_peak ELSE mem_peak END,
  energy_j = energy_j + excluded.energy_j, idle_s = idle_s + excluded.idle_s
"""
_ADD_CARD = """
INSERT INTO {table} VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (minute, card) DO UPDATE SET
  seen_s = seen_s + excluded.seen_s, util_s = util_s + excluded.util_s,
  util_known_s = util_known_s + excluded.util_known_s, energy_j = energy_j + excluded.energy_j,
  held_s = held_s + excluded.held_s, busy_s = busy_s + excluded.busy_s
"""
_LAST_USE = """
UPDATE cards SET card_index = ?, name = ?,
  last_held = CASE WHEN ? > 0 AND (last_held IS NULL OR ? > last_held) THEN ? ELSE last_held END,
  last_busy = CASE WHEN ? > 0 AND (last_busy IS NULL OR ? > last_busy) THEN ? ELSE last_busy END
WHERE id = ?
"""


def create(conn: sqlite3.Connection) -> None:
    """The tables, made where missing; a format-1 file upgraded in place (one transaction: all or nothing)."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"written by a newer gpumon (schema {version})")
    if version == SCHEMA_VERSION:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]  # another writer may have upgraded it
        if version < SCHEMA_VERSION:
            old = version == 1 and conn.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'holder_minutes' AND sql LIKE '%label TEXT%'").fetchone()
            if old:
                conn.execute("ALTER TABLE holder_minutes RENAME TO v1_holder_minutes")
                conn.execute("ALTER TABLE card_minutes RENAME TO v1_card_minutes")
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            if old:
                _from_format_1(conn)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _from_format_1(conn: sqlite3.Connection) -> None:
    """Every row of a format-1 file, into the minute tables (rolled up afterwards, as any minutes)."""
    conn.execute("""INSERT INTO cards (host, card, card_index, name, last_held, last_busy)
        SELECT host, card, max(card_index), max(name), max(CASE WHEN held_s > 0 THEN minute END),
               max(CASE WHEN busy_s > 0 THEN minute END) FROM v1_card_minutes GROUP BY host, card""")
    conn.execute("""INSERT OR IGNORE INTO cards (host, card, card_index, name)
        SELECT host, card, max(card_index), '' FROM v1_holder_minutes GROUP BY host, card""")
    conn.execute("""INSERT INTO holders (kind, holder, label, user)
        SELECT kind, holder, max(label), max(user) FROM v1_holder_minutes GROUP BY kind, holder""")
    conn.execute("""INSERT INTO holder_minutes SELECT r.minute, c.id, h.id, r.held_s, r.sm_s, r.sm_known_s,
        r.mem_s, r.mem_peak, r.energy_j, r.idle_s
        FROM v1_holder_minutes r JOIN cards c ON c.host = r.host AND c.card = r.card
        JOIN holders h ON h.kind = r.kind AND h.holder = r.holder""")
    conn.execute("""INSERT INTO card_minutes SELECT r.minute, c.id, r.seen_s, r.util_s, r.util_known_s, r.energy_j,
        r.held_s, r.busy_s FROM v1_card_minutes r JOIN cards c ON c.host = r.host AND c.card = r.card""")
    conn.execute("DROP TABLE v1_holder_minutes")
    conn.execute("DROP TABLE v1_card_minutes")


class Ids:
    """The ids of the cards and holders a writer has met (asked of the file once, then kept)."""

    def __init__(self) -> None:
        self.cards: dict[tuple[str, str], int] = {}
        self.holders: dict[tuple[str, str], tuple[int, str, str | None]] = {}

    def card(self, conn: sqlite3.Connection, host: str, card: str, index: int, name: str) -> int:
        ident = self.cards.get((host, card))
        if ident is None:
            conn.execute("INSERT INTO cards (host, card, card_index, name) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT (host, card) DO NOTHING", (host, card, index, name))
            ident = self.cards[host, card] = conn.execute("SELECT id FROM cards WHERE host = ? AND card = ?",
                                                          (host, card)).fetchone()[0]
        return ident

    def holder(self, conn: sqlite3.Connection, kind: str, holder: str, label: str, user: str | None) -> int:
        known = self.holders.get((kind, holder))
        if known is not None and known[1:] == (label, user):
            return known[0]
        conn.execute("INSERT INTO holders (kind, holder, label, user) VALUES (?, ?, ?, ?) ON CONFLICT (kind, holder) "
                     "DO UPDATE SET label = excluded.label, user = excluded.user", (kind, holder, label, user))
        ident = conn.execute("SELECT id FROM holders WHERE kind = ? AND holder = ?", (kind, holder)).fetchone()[0]
        self.holders[kind, holder] = (ident, label, user)
        return ident


def write_minute(conn: sqlite3.Connection, minute: Minute, ids: Ids) -> None:
    write_minutes(conn, [minute], ids)


def write_minutes(conn: sqlite3.Connection, minutes: list[Minute], ids: Ids) -> None:
    """Minutes' rows in one transaction (the writer's: one minute; a benchmark building a year: a
    day), added to what is there; their cards' last use moved on. `ids` is forgotten by the caller
    when the transaction fails (an id it learnt may be rolled back)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for minute in minutes:
            start = minute.start
            # Every card a holder row names has a card row of the same minute (one sample makes both).
            cards, uses = [], []
            for (host, card), c in minute.cards.items():
                ident = ids.card(conn, host, card, c.card_index, c.name)
                cards.append((start, ident, c.seen_s, c.util_s, c.util_known_s, c.energy_j, c.held_s, c.busy_s))
                uses.append((c.card_index, c.name, c.held_s, start, start, c.busy_s, start, start, ident))
            conn.executemany(_LAST_USE, uses)
            rows = [(start, ids.card(conn, host, card, row[0], ""), ids.holder(conn, kind, ident, row[1], row[2]),
                     *row[3:]) for (host, card, kind, ident), row in minute.holders.items()]
            conn.executemany(_ADD_HOLDER.format(table="holder_minutes"), rows)
            conn.executemany(_ADD_CARD.format(table="card_minutes"), cards)
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def roll_up(conn: sqlite3.Connection, before: float) -> None:
    """Minutes of the hours that ended by `before`, added into the hour tables (one transaction)."""
    until = int(before // HOUR_S * HOUR_S)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"""INSERT INTO holder_hours SELECT minute / {HOUR_S} * {HOUR_S} AS hour, card, holder,
            sum(held_s), sum(sm_s), sum(sm_known_s), sum(mem_s), max(mem_peak), sum(energy_j), sum(idle_s)
            FROM holder_minutes WHERE minute < ? GROUP BY hour, card, holder
            ON CONFLICT {_ADD_HOLDER.split("ON CONFLICT")[1]}""", (until,))
        conn.execute(f"""INSERT INTO card_hours SELECT minute / {HOUR_S} * {HOUR_S} AS hour, card,
            sum(seen_s), sum(util_s), sum(util_known_s), sum(energy_j), sum(held_s), sum(busy_s)
            FROM card_minutes WHERE minute < ? GROUP BY hour, card
            ON CONFLICT {_ADD_CARD.split("ON CONFLICT")[1]}""", (until,))
        conn.execute("DELETE FROM holder_minutes WHERE minute < ?", (until,))
        conn.execute("DELETE FROM card_minutes WHERE minute < ?", (until,))
        conn.execute("INSERT INTO meta VALUES ('rolled_before', ?) ON CONFLICT (key) DO UPDATE SET "
                     "value = max(value, excluded.value)", (until,))
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def prune(conn: sqlite3.Connection, before: float) -> None:
    """Rows older than `before` deleted, and the cards and holders no row names any more."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table in ("holder_minutes", "holder_hours", "card_minutes", "card_hours"):
            conn.execute(f"DELETE FROM {table} WHERE minute < ?", (before,))
        conn.execute("DELETE FROM cards WHERE id NOT IN (SELECT card FROM card_hours UNION SELECT card FROM "
                     "card_minutes UNION SELECT card FROM holder_hours UNION SELECT card FROM holder_minutes)")
        conn.execute("DELETE FROM holders WHERE id NOT IN (SELECT holder FROM holder_hours UNION "
                     "SELECT holder FROM holder_minutes)")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
