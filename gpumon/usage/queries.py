"""The report's numbers, asked of the ledger (read-only: a reader never writes or creates the file).

Every process counts in its user's rows, and also in its job's, pod's or container's: sums per
user, per card and per day read the user rows (each process once), per job the others. A row's
`gpu_hours` are card-hours held (two cards for an hour: 2), `mean_sm` its processes' SM % over the
time it held them (where the driver reports it), `idle_hours` the time it held a card with all of
its processes there at 0 % SM, `peak_memory` the most it held on one card in one minute's samples.
Days are local days (the TZ of the reader).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from gpumon.usage.ledger import connect

BY = ("user", "job", "card", "day")
_SUMS = ("sum(held_s), sum(sm_s), sum(sm_known_s), sum(mem_s), max(mem_peak), sum(energy_j), sum(idle_s), "
         "min(minute), max(minute), count(DISTINCT host || ' ' || card)")
_DAY = "date(minute, 'unixepoch', 'localtime')"


def open_ledger(path: Path) -> sqlite3.Connection:
    return connect(path, write=False)


def _figures(row: tuple, price: float | None) -> dict[str, Any]:
    held, sm, sm_known, mem, peak, energy, idle, first, last, cards = row
    kwh = (energy or 0.0) / 3.6e6
    return {"gpu_hours": round((held or 0.0) / 3600, 6), "energy_kwh": round(kwh, 6),
            "cost": None if price is None else round(kwh * price, 6),
            "mean_sm": round(sm / sm_known, 1) if sm_known else None,
            "idle_hours": round((idle or 0.0) / 3600, 6), "peak_memory": peak,
            "mean_memory": int(mem / held) if held else None, "cards": cards, "first": first, "last": last}


def holder_rows(conn: sqlite3.Connection, start: float, end: float, by: str,
                price: float | None = None) -> list[dict[str, Any]]:
    """The report's rows for `--by` (BY): users each followed by their jobs, pods and containers
    (`user`), those alone (`job`), cards (`card`), days (`day`)."""
    window = (start, end)
    where = "minute >= ? AND minute < ?"
    out: list[dict[str, Any]] = []
    if by in ("user", "job"):
        users = {}
        if by == "user":
            for host, ident, label, *rest in conn.execute(
                    f"SELECT host, holder, max(label), {_SUMS} FROM holder_minutes WHERE kind = 'user' AND {where} "
                    "GROUP BY host, holder", window):
                users[host, ident] = {"host": host, "kind": "user", "id": ident, "label": label, "user": ident,
                                      **_figures(tuple(rest), price)}
        jobs = [{"host": host, "kind": kind, "id": ident, "label": label, "user": user, **_figures(tuple(rest), price)}
                for host, kind, ident, label, user, *rest in conn.execute(
                    f"SELECT host, kind, holder, max(label), max(user), {_SUMS} FROM holder_minutes "
                    f"WHERE kind != 'user' AND {where} GROUP BY host, kind, holder", window)]
        if by == "job":
            return sorted(jobs, key=lambda r: (-r["gpu_hours"], r["host"], r["kind"], r["id"]))
        for key, row in sorted(users.items(), key=lambda kv: (-kv[1]["gpu_hours"], kv[0])):
            out.append(row)
            out += sorted((j for j in jobs if (j["host"], j["user"] or "?") == key),
                          key=lambda r: (-r["gpu_hours"], r["kind"], r["id"]))
        return out
    if by == "card":
        for host, card, index, *rest in conn.execute(
                f"SELECT host, card, max(card_index), {_SUMS} FROM holder_minutes WHERE kind = 'user' AND {where} "
                "GROUP BY host, card ORDER BY host, max(card_index)", window):
            out.append({"host": host, "card": card, "index": index, **_figures(tuple(rest), price)})
        return out
    if by == "day":
        for day, *rest in conn.execute(
                f"SELECT {_DAY} AS day, {_SUMS} FROM holder_minutes WHERE kind = 'user' AND {where} "
                "GROUP BY day ORDER BY day", window):
            out.append({"day": day, **_figures(tuple(rest), price)})
        return out
    raise ValueError(by)


def card_rows(conn: sqlite3.Connection, start: float, end: float, price: float | None = None) -> list[dict[str, Any]]:
    """Each card ever recorded (as long as rows are kept): its last use (the start of the last
    minute a process held it, or it was busy) whenever that was, and its figures in the window."""
    last = {(host, card): (index, name, held, busy) for host, card, index, name, held, busy in conn.execute(
        "SELECT host, card, max(card_index), max(name), max(CASE WHEN held_s > 0 THEN minute END), "
        "max(CASE WHEN busy_s > 0 THEN minute END) FROM card_minutes GROUP BY host, card")}
    figures = {(host, card): (seen, util, known, energy, held) for host, card, seen, util, known, energy, held in
               conn.execute("SELECT host, card, sum(seen_s), sum(util_s), sum(util_known_s), sum(energy_j), "
                            "sum(held_s) FROM card_minutes WHERE minute >= ? AND minute < ? GROUP BY host, card",
                            (start, end))}
    out = []
    for (host, card), (index, name, last_held, last_busy) in last.items():
        seen, util, known, energy, held = figures.get((host, card), (0.0, 0.0, 0.0, 0.0, 0.0))
        kwh = energy / 3.6e6
        out.append({"host": host, "card": card, "index": index, "name": name, "last_used": last_held,
                    "last_busy": last_busy, "watched_hours": round(seen / 3600, 6),
                    "held_hours": round(held / 3600, 6), "mean_util": round(util / known, 1) if known else None,
                    "energy_kwh": round(kwh, 6), "cost": None if price is None else round(kwh * price, 6)})
    return sorted(out, key=lambda r: (r["host"], r["index"], r["card"]))


def daily_util(conn: sqlite3.Connection, start: float, end: float) -> list[dict[str, Any]]:
    """Each card's mean utilisation per local day in the window (the plot, the page's strip)."""
    return [{"day": day, "host": host, "card": card, "index": index,
             "mean_util": round(util / known, 1) if known else None}
            for day, host, card, index, util, known in conn.execute(
                f"SELECT {_DAY} AS day, host, card, max(card_index), sum(util_s), sum(util_known_s) FROM card_minutes "
                "WHERE minute >= ? AND minute < ? GROUP BY day, host, card ORDER BY day, host, max(card_index)",
                (start, end))]
