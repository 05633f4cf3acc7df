"""The report: one document (`gpumon report --json`, the page's `/api/report`), and what the
terminal shows of it (a table, CSV, plots).

    {"schema": 1, "time": now, "from": t, "to": t, "by": "user"|"job"|"card"|"day",
     "source": "ledger"|"prometheus"|"hosts", "price_per_kwh": float|null,
     "resolution": s, "hourly_before": t|null   (the ledger's: 60, or 3600 where the window reaches
                                                  back before the minutes kept, into hour rows),
     "rows": [{"host", "kind", "id", "label", "user", (by card: "card", "index"; by day: "day"),
               "gpu_hours", "energy_kwh", "cost", "mean_sm", "idle_hours", "peak_memory", "mean_memory",
               "cards", "first", "last"}],
     "cards": [{"host", "card", "index", "name", "last_used", "last_busy", "watched_hours",
                "held_hours", "mean_util", "energy_kwh", "cost"}],
     "days": [{"day", "host", "card", "index", "mean_util"}],
     "hosts": [{"host", "state", "error"}]   (with --hosts)}

Text in it (user names, job names, card names) comes from the driver, /proc and other hosts: every
view makes it printable and never reads it as markup.
"""

from __future__ import annotations

import csv
import io
import sqlite3
import threading
import time
from typing import Any

from gpumon.errors import GpumonError
from gpumon.sanitize import printable
from gpumon.units import format_bytes
from gpumon.usage import queries
from gpumon.usage.ledger import describe
from gpumon.usage.settings import HistorySettings
from gpumon.usage.store import HOUR_S

FIGURES = ("gpu_hours", "energy_kwh", "cost", "mean_sm", "idle_hours", "peak_memory", "mean_memory")


class LedgerError(GpumonError):
    """No ledger to read, or one that cannot be read (exit status 1: nothing wrong with the command)."""

    exit_status = 1


def ledger_report(settings: HistorySettings, start: float, end: float, by: str,
                  now: float | None = None) -> dict[str, Any]:
    """From this machine's ledger: the file `[history] path` names, or every host's in the default folder."""
    paths = [p for p in settings.read_paths() if p.exists()]
    if not paths:
        raise LedgerError(f"no usage history at {settings.path} yet: `gpumon watch` records it "
                          "(or the TUI, where no watch runs)")
    conns: list[sqlite3.Connection] = []
    path = paths[0]
    try:
        try:
            for path in paths:
                conns.append(queries.open_ledger(path))
            path = paths[0] if len(paths) == 1 else path.parent
            rows = queries.holder_rows(conns, start, end, by, settings.price_per_kwh)
            cards, days = queries.card_rows_and_days(conns, start, end, settings.price_per_kwh)
            hourly = queries.hourly_before(conns)
        finally:
            for conn in conns:
                conn.close()
    except sqlite3.Error as exc:
        raise LedgerError(f"usage history {path}: {describe(exc)}") from None
    doc = document(start, end, by, "ledger", settings.price_per_kwh, rows, cards, days, now)
    doc["resolution"] = HOUR_S if hourly is not None and start < hourly else settings.period_s
    doc["hourly_before"] = hourly
    return doc


def document(start: float, end: float, by: str, source: str, price: float | None, rows: list, cards: list,
             days: list, now: float | None = None) -> dict[str, Any]:
    return {"schema": 1, "time": time.time() if now is None else now, "from": start, "to": end, "by": by,
            "source": source, "price_per_kwh": price, "rows": rows, "cards": cards, "days": days}


def merge(reports: dict[str, dict[str, Any] | None], errors: dict[str, str], start: float, end: float, by: str,
          price: float | None) -> dict[str, Any]:
    """Hosts' reports as one: every row and card keeps its host (the host list's name for it);
    days add up per host. A host that could not answer is listed with its error."""
    rows: list = []
    cards: list = []
    days: list = []
    for host, report in reports.items():
        if report is None:
            continue
        for part, into in (("rows", rows), ("cards", cards), ("days", days)):
            for item in report.get(part, []):
                if isinstance(item, dict):
                    into.append({**item, "host": host})
    doc = document(start, end, by, "hosts", price, rows, cards, days)
    doc["hosts"] = [{"host": host, "state": "ok" if host not in errors else "error", "error": errors.get(host)}
                    for host in reports]
    return doc


# -- the terminal's views of it --


def _when(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t is not None else "never"


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "–"
    if 0 < value < 10 ** -digits:  # a few seconds held is not nothing
        return "<" + f"{10 ** -digits:.{digits}f}"
    return f"{value:.{digits}f}"


def _who(row: dict[str, Any], hosts: bool) -> str:
    if "day" in row:
        who = str(row["day"])
    elif "card" in row:
        who = f"GPU {row.get('index')}"
    else:
        indent = "  " if row.get("kind") != "user" and row.get("by_user") else ""
        who = indent + printable(str(row.get("label") or row.get("id")))
    return (printable(str(row.get("host"))) + ": " if hosts and "host" in row else "") + who


def text(doc: dict[str, Any]) -> str:
    """The report as a table, then each card's last use."""
    hosts = doc.get("source") == "hosts" or len({r.get("host") for r in doc["rows"] + doc["cards"]} - {None}) > 1
    priced = doc.get("price_per_kwh") is not None
    head = {"user": "USER / JOB", "job": "JOB / POD / CONTAINER", "card": "CARD", "day": "DAY"}[doc["by"]]
    lines = [f"{_when(doc['from'])} – {_when(doc['to'])}"]
    if doc.get("resolution", 0) >= HOUR_S:
        lines[0] += f"  (whole hours before {_when(doc.get('hourly_before'))}: older minutes are kept as hours)"
    table = [[head, "GPU-h", "kWh"] + (["COST"] if priced else []) + ["SM %", "IDLE-h", "PEAK MEM"]]
    for row in doc["rows"]:
        marked = {**row, "by_user": doc["by"] == "user"}
        table.append([_who(marked, hosts), _num(row["gpu_hours"], 2), _num(row["energy_kwh"], 2)]
                     + ([_num(row.get("cost"), 2)] if priced else [])
                     + [_num(row["mean_sm"]), _num(row["idle_hours"], 2),
                        format_bytes(row["peak_memory"], na="–")])
    if len(table) == 1:
        lines.append("no card was held in this time")
    else:
        lines += _columns(table)
    lines.append("")
    cards = [["CARD", "NAME", "LAST USED", "HELD-h", "UTIL %"]]
    for card in doc["cards"]:
        where = (printable(str(card["host"])) + ":" if hosts else "") + f"GPU {card['index']}"
        cards.append([where, printable(str(card.get("name") or "")), _when(card.get("last_used")),
                      _num(card.get("held_hours"), 2), _num(card.get("mean_util"))])
    lines += _columns(cards) if len(cards) > 1 else ["no card recorded"]
    for host in doc.get("hosts", []):
        if host.get("error"):  # the error names its host
            lines.append(printable(str(host["error"])))
    return "\n".join(lines)


def _columns(table: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return ["  ".join(c.ljust(w) if i == 0 or i == 1 and table[0][1] == "NAME" else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in table]


def csv_text(doc: dict[str, Any]) -> str:
    """The rows as CSV (a header line first); fields as in the JSON."""
    keys = ["host", "kind", "id", "label", "user", "card", "index", "day", *FIGURES, "cards", "first", "last"]
    present = [k for k in keys if any(k in r for r in doc["rows"])] or ["host", *FIGURES]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(present)
    for row in doc["rows"]:
        writer.writerow([_csv_cell(row.get(k)) for k in present])
    return out.getvalue()


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    text_value = printable(str(value))
    return "'" + text_value if text_value[:1] in ("=", "+", "-", "@") and not _is_number(text_value) else text_value


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def plot(doc: dict[str, Any], width: int = 100, height: int = 20) -> str:
    """Utilisation per card per day, drawn in the terminal (plotext: one line per card)."""
    import plotext

    days = sorted({d["day"] for d in doc["days"]})
    if not days:
        return "no card was watched in this time"
    series: dict[tuple[str, str], dict[str, float | None]] = {}
    labels: dict[tuple[str, str], str] = {}
    hosts = doc.get("source") == "hosts"
    for d in doc["days"]:
        key = (str(d.get("host")), str(d["card"]))
        series.setdefault(key, {})[d["day"]] = d["mean_util"]
        labels[key] = (printable(key[0]) + ":" if hosts else "") + f"GPU {d.get('index')}"
    fig = plotext.figure
    fig.clear()
    fig.plot_size(width, height)
    fig.theme("colorless")
    fig.title("utilisation per card per day (%)")
    positions = list(range(1, len(days) + 1))
    fig.ruler("y").lim(0, 100)
    fig.ruler("x").lim(0.5, len(days) + 0.5)
    fig.ruler("x").ticks(positions, [day[5:] for day in days])
    for key, by_day in series.items():
        points = [(p, by_day[day]) for p, day in zip(positions, days) if by_day.get(day) is not None]
        if points:
            fig.draw(fig.signal([p for p, _ in points], [v for _, v in points]).lines(True).label(labels[key]))
    return fig.build().string().replace("\x1b[0m", "")


class PageReport:
    """The web page's "last 7 days" (`/api/report`): per user, and each card's days; asked of the
    ledger at most every REFRESH_S (in the server's thread pool: a read never holds up the loop),
    once however many viewers ask at the same moment: the others wait for that one answer."""

    SPAN_S = 7 * 86400.0
    REFRESH_S = 30.0

    def __init__(self, settings: HistorySettings, clock=time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._made: tuple[float, dict[str, Any]] | None = None
        self._making = threading.Lock()

    def __call__(self) -> dict[str, Any]:
        with self._making:
            now = self._clock()
            if self._made is not None and now - self._made[0] < self.REFRESH_S:
                return self._made[1]
            return self._make(now)

    def _make(self, now: float) -> dict[str, Any]:
        try:
            doc = ledger_report(self.settings, now - self.SPAN_S, now, "user", now)
        except LedgerError as exc:
            doc = document(now - self.SPAN_S, now, "user", "ledger", self.settings.price_per_kwh, [], [], [], now)
            doc["error"] = str(exc)
        self._made = (now, doc)
        return doc
