"""The report's numbers, asked of the ledger (read-only: a reader never writes or creates the file),
of one file or several (one per host, in a folder hosts share): their sums add up.

Every process counts in its user's rows, and also in its job's, pod's or container's: sums per
user, per card and per day read the user rows (each process once), per job the others. A row's
`gpu_hours` are card-hours held (two cards for an hour: 2), `mean_sm` its processes' SM % over the
time it held them (where the driver reports it), `idle_hours` the time it held a card with all of
its processes there at 0 % SM, `peak_memory` the most it held on one card in one minute's samples.
Days are local days (the TZ of the reader).

The window reads the minute rows that start in it and the hour rows (minutes rolled up) that start
in it: where it reaches back into hours, its edges are whole hours (`resolution`). The database
groups by card and holder ids (a year is a few hundred thousand rows); names are put on the few
groups here. A format-1 file (a writer not yet upgraded) is read through temporary tables and views
that give it format 2's shape, in the reader's connection alone.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpumon.usage import store
from gpumon.usage.ledger import connect

BY = ("user", "job", "card", "day")
_DAY = "date(minute, 'unixepoch', 'localtime')"
_HOLDER_SUMS = ("sum(held_s), sum(sm_s), sum(sm_known_s), sum(mem_s), max(mem_peak), sum(energy_j), sum(idle_s), "
                "min(minute), max(minute)")
_CARD_SUMS = "sum(seen_s), sum(util_s), sum(util_known_s), sum(energy_j), sum(held_s)"


def open_ledger(path: Path) -> sqlite3.Connection:
    conn = connect(path, write=False)
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > store.SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"written by a newer gpumon (schema {version})")
        if version < store.SCHEMA_VERSION:
            _format_1_views(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _format_1_views(conn: sqlite3.Connection) -> None:
    conn.executescript(store.SCHEMA.replace("CREATE TABLE IF NOT EXISTS holder_minutes", "CREATE TEMP TABLE unused_hm")
                       .replace("CREATE TABLE IF NOT EXISTS card_minutes", "CREATE TEMP TABLE unused_cm")
                       .replace("CREATE TABLE IF NOT EXISTS", "CREATE TEMP TABLE"))
    conn.execute("""INSERT INTO temp.cards (host, card, card_index, name, last_held, last_busy)
        SELECT host, card, max(card_index), max(name), max(CASE WHEN held_s > 0 THEN minute END),
               max(CASE WHEN busy_s > 0 THEN minute END) FROM main.card_minutes GROUP BY host, card""")
    conn.execute("""INSERT INTO temp.holders (kind, holder, label, user)
        SELECT kind, holder, max(label), max(user) FROM main.holder_minutes GROUP BY kind, holder""")
    conn.execute("""CREATE TEMP VIEW holder_minutes AS SELECT r.minute, c.id AS card, h.id AS holder, r.held_s,
        r.sm_s, r.sm_known_s, r.mem_s, r.mem_peak, r.energy_j, r.idle_s FROM main.holder_minutes r
        JOIN temp.cards c ON c.host = r.host AND c.card = r.card JOIN temp.holders h ON h.kind = r.kind
        AND h.holder = r.holder""")
    conn.execute("""CREATE TEMP VIEW card_minutes AS SELECT r.minute, c.id AS card, r.seen_s, r.util_s,
        r.util_known_s, r.energy_j, r.held_s, r.busy_s FROM main.card_minutes r
        JOIN temp.cards c ON c.host = r.host AND c.card = r.card""")


def _rows(table: str) -> str:
    """The table's minute and hour rows that start in the window (:start, :end)."""
    return (f"(SELECT * FROM {table}_minutes WHERE minute >= :start AND minute < :end UNION ALL "
            f"SELECT * FROM {table}_hours WHERE minute >= :start AND minute < :end)")


def hourly_before(conns: Iterable[sqlite3.Connection]) -> float | None:
    """Before this, the files keep hours, not minutes (None: minutes all along)."""
    found = [row[0] for conn in conns for row in conn.execute("SELECT value FROM meta WHERE key = 'rolled_before'")]
    return max(found) if found else None


def _names(conn: sqlite3.Connection) -> tuple[dict[int, tuple], dict[int, tuple]]:
    cards = {row[0]: row[1:] for row in conn.execute(
        "SELECT id, host, card, card_index, name, last_held, last_busy FROM cards")}
    holders = {row[0]: row[1:] for row in conn.execute("SELECT id, kind, holder, label, user FROM holders")}
    return cards, holders


class _Sums:
    __slots__ = ("held", "sm", "sm_known", "mem", "peak", "energy", "idle", "first", "last", "cards", "label",
                 "user", "index")

    def __init__(self) -> None:
        self.held = self.sm = self.sm_known = self.mem = self.energy = self.idle = 0.0
        self.peak = self.first = self.last = self.label = self.user = self.index = None
        self.cards: set[tuple[str, str]] = set()

    def add(self, card: tuple[str, str], row: tuple) -> None:
        held, sm, sm_known, mem, peak, energy, idle, first, last = row
        self.held += held or 0.0
        self.sm += sm or 0.0
        self.sm_known += sm_known or 0.0
        self.mem += mem or 0.0
        self.energy += energy or 0.0
        self.idle += idle or 0.0
        self.peak = _most(self.peak, peak)
        self.first = first if self.first is None or first < self.first else self.first
        self.last = _most(self.last, last)
        self.cards.add(card)

    def figures(self, price: float | None) -> dict[str, Any]:
        kwh = self.energy / 3.6e6
        return {"gpu_hours": round(self.held / 3600, 6), "energy_kwh": round(kwh, 6),
                "cost": None if price is None else round(kwh * price, 6),
                "mean_sm": round(self.sm / self.sm_known, 1) if self.sm_known else None,
                "idle_hours": round(self.idle / 3600, 6), "peak_memory": self.peak,
                "mean_memory": int(self.mem / self.held) if self.held else None, "cards": len(self.cards),
                "first": self.first, "last": self.last}


def _most(a, b):
    return b if a is None or (b is not None and b > a) else a


def holder_rows(conns: list[sqlite3.Connection], start: float, end: float, by: str,
                price: float | None = None) -> list[dict[str, Any]]:
    """The report's rows for `--by` (BY): users each followed by their jobs, pods and containers
    (`user`), those alone (`job`), cards (`card`), days (`day`)."""
    if by not in BY:
        raise ValueError(by)
    window = {"start": start, "end": end}
    users: dict[tuple, _Sums] = {}
    jobs: dict[tuple, _Sums] = {}
    for conn in conns:
        cards, holders = _names(conn)
        only_users = "" if by in ("user", "job") else \
            "WHERE holder IN (SELECT id FROM holders WHERE kind = 'user')"
        if by == "day":
            query = (f"SELECT {_DAY} AS day, card, holder, {_HOLDER_SUMS} FROM {_rows('holder')} {only_users} "
                     "GROUP BY day, card")
        else:
            query = f"SELECT 0, card, holder, {_HOLDER_SUMS} FROM {_rows('holder')} {only_users} GROUP BY card, holder"
        for day, card_id, holder_id, *sums in conn.execute(query, window):
            host, card, index, *_ = cards[card_id]
            kind, ident, label, user = holders[holder_id]
            if by == "day":
                key, into = (day,), users
            elif by == "card":
                key, into = (host, card), users
            elif kind == "user":
                key, into = (host, ident), users
            else:
                key, into = (host, kind, ident), jobs
            group = into.get(key)
            if group is None:
                group = into[key] = _Sums()
            group.add((host, card), tuple(sums))
            group.label = _most(group.label, label)
            group.user = _most(group.user, user)
            group.index = _most(group.index, index)
    if by == "day":
        return [{"day": day, **users[day,].figures(price)} for (day,) in sorted(users)]
    if by == "card":
        return [{"host": host, "card": card, "index": s.index, **s.figures(price)}
                for (host, card), s in sorted(users.items(), key=lambda kv: (kv[0][0], kv[1].index, kv[0][1]))]
    job_rows = [{"host": host, "kind": kind, "id": ident, "label": s.label, "user": s.user, **s.figures(price)}
                for (host, kind, ident), s in jobs.items()]
    if by == "job":
        return sorted(job_rows, key=lambda r: (-r["gpu_hours"], r["host"], r["kind"], r["id"]))
    user_rows = {(host, ident): {"host": host, "kind": "user", "id": ident, "label": s.label, "user": ident,
                                 **s.figures(price)} for (host, ident), s in users.items()}
    out: list[dict[str, Any]] = []
    for key, row in sorted(user_rows.items(), key=lambda kv: (-kv[1]["gpu_hours"], kv[0])):
        out.append(row)
        out += sorted((j for j in job_rows if (j["host"], j["user"] or "?") == key),
                      key=lambda r: (-r["gpu_hours"], r["kind"], r["id"]))
    return out


def card_rows_and_days(conns: list[sqlite3.Connection], start: float, end: float,
                       price: float | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each card ever recorded (as long as rows are kept): its last use (the start of the last
    minute a process held it, or it was busy) whenever that was, and its figures in the window;
    and each card's mean utilisation per local day in the window (the plot, the page's strip).
    One pass over the window's card rows gives both."""
    found: dict[tuple[str, str], list] = {}
    days: dict[tuple[str, str, str], list] = {}
    for conn in conns:
        cards, _ = _names(conn)
        figures: dict[int, list[float]] = {}
        for day_name, card_id, *sums in conn.execute(
                f"SELECT {_DAY} AS day, card, {_CARD_SUMS} FROM {_rows('card')} GROUP BY day, card",
                {"start": start, "end": end}):
            sums = [x or 0.0 for x in sums]
            total = figures.setdefault(card_id, [0.0] * 5)
            total[:] = [a + b for a, b in zip(total, sums)]
            host, card, index, *_ = cards[card_id]
            day = days.setdefault((day_name, host, card), [index, 0.0, 0.0])
            day[1] += sums[1]
            day[2] += sums[2]
        for card_id, (host, card, index, name, last_held, last_busy) in cards.items():
            sums = figures.get(card_id, [0.0] * 5)
            known = found.get((host, card))
            if known is None:
                found[host, card] = [index, name, last_held, last_busy, *sums]
            else:
                known[2], known[3] = _most(known[2], last_held), _most(known[3], last_busy)
                known[4:] = [a + b for a, b in zip(known[4:], sums)]
    out = []
    for (host, card), (index, name, last_held, last_busy, seen, util, known, energy, held) in found.items():
        kwh = energy / 3.6e6
        out.append({"host": host, "card": card, "index": index, "name": name, "last_used": last_held,
                    "last_busy": last_busy, "watched_hours": round(seen / 3600, 6),
                    "held_hours": round(held / 3600, 6), "mean_util": round(util / known, 1) if known else None,
                    "energy_kwh": round(kwh, 6), "cost": None if price is None else round(kwh * price, 6)})
    daily = [{"day": day, "host": host, "card": card, "index": index,
              "mean_util": round(util / known, 1) if known else None}
             for (day, host, card), (index, util, known) in sorted(days.items(),
                                                                   key=lambda kv: (kv[0][0], kv[0][1], kv[1][0]))]
    return sorted(out, key=lambda r: (r["host"], r["index"], r["card"])), daily
