"""Where the usage ledger is and what it keeps: the config's `[history]` table, and the dates
`gpumon report` is given (its spans are units.parse_duration's).

    [history]
    path = "/var/lib/gpumon/usage.sqlite"   # default: usage.HOST.sqlite in the state folder
    keep = "90d"                            # rows older than this are removed (default 90 days)
    keep_minutes = "2d"                     # minute rows this long, then one row per hour (default 2 days)
    price_per_kwh = 0.25                    # the report adds a cost to each row's energy
    record = false                          # watch and the TUI keep no ledger

The default path is in the user's state folder (`~/.local/state/gpumon/`, beside the jobs), and
its name carries the host: a home shared between hosts (NFS) keeps one file per host, each with its
own writer and locks, and `report` reads them all. A `watch` run as a system service names a system
path (`/var/lib/gpumon/usage.sqlite`): that one file is all `report` reads.
`GPUMON_HISTORY_PERIOD` (whole seconds, for tests only) shortens the minute rows are added up over.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from gpumon.errors import UsageError
from gpumon.units import parse_duration
from gpumon.usage.store import KEEP_MINUTES_S

PERIOD_S = 60.0  # one row per card per holder per minute
DEFAULT_KEEP_S = 90 * 86400.0


@dataclass(frozen=True)
class HistorySettings:
    path: Path
    keep_s: float = DEFAULT_KEEP_S
    price_per_kwh: float | None = None
    record: bool = True
    period_s: float = PERIOD_S
    keep_minutes_s: float = KEEP_MINUTES_S
    per_host: bool = False  # the default path: one file per host in a folder hosts may share

    def read_paths(self) -> list[Path]:
        """The files `report` reads: the one named, or every host's beside the default one."""
        if not self.per_host:
            return [self.path]
        hosts = sorted(self.path.parent.glob("usage.*.sqlite"))
        legacy = self.legacy_path()
        return hosts + [legacy] if legacy is not None and legacy.exists() else hosts

    def legacy_path(self) -> Path | None:
        """The default file before its name carried the host: made this host's when it first writes."""
        return self.path.with_name("usage.sqlite") if self.per_host else None


def default_path() -> Path:
    """In the state folder gpumon's jobs use (jobs/files.py's state_dir), named after the host."""
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname().split(".")[0]) or "localhost"
    return Path(platformdirs.user_state_dir("gpumon")) / f"usage.{host}.sqlite"


def parse_when(text: str, what: str) -> float:
    """A date or time as people write it: 2026-12-01, 2026-12-01T14:00, '2026-12-01 14:00' (local
    time unless it names a zone), or unix seconds -> unix seconds."""
    value = text.strip()
    if re.fullmatch(r"\d{9,11}(\.\d+)?", value):
        return float(value)
    try:
        when = dt.datetime.fromisoformat(value)
    except ValueError:
        raise UsageError(f"bad {what} {text!r}: expected a date like 2026-12-01 or 2026-12-01T14:00") from None
    return when.timestamp()


def history_settings(table: dict | None) -> HistorySettings:
    """The `[history]` table (config.history) checked: a bad value is a UsageError naming it."""
    table = table or {}
    keep = parse_duration(table["keep"], "[history] keep", above_zero=True) if "keep" in table else DEFAULT_KEEP_S
    minutes = (parse_duration(table["keep_minutes"], "[history] keep_minutes", above_zero=True)
               if "keep_minutes" in table else KEEP_MINUTES_S)
    price = table.get("price_per_kwh")
    if price is not None and not 0 <= float(price) < 1e6:
        raise UsageError(f"bad [history] price_per_kwh {price!r}: expected a price of one kWh, 0 or more")
    period = PERIOD_S
    if os.environ.get("GPUMON_HISTORY_PERIOD"):
        try:
            period = int(os.environ["GPUMON_HISTORY_PERIOD"])
        except ValueError:
            period = 0
        if not 1 <= period <= 3600:  # rows are keyed by whole seconds
            raise UsageError(f"bad GPUMON_HISTORY_PERIOD {os.environ['GPUMON_HISTORY_PERIOD']!r}: "
                             "expected whole seconds, 1 to 3600")
    path = Path(table["path"]) if table.get("path") else default_path()
    return HistorySettings(path, keep, None if price is None else float(price), bool(table.get("record", True)),
                           period, minutes, per_host=not table.get("path"))
