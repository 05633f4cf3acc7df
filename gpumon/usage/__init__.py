"""Who used the cards, kept: the usage ledger (SQLite) that `gpumon watch` and the TUI write, and
`gpumon report`'s answers from it (or from Prometheus). Below the views, beside jobs and alerting;
never imports Textual.

    settings   the [history] table: path, keep, keep_minutes, price_per_kwh; spans and dates
    minutes    a minute of usage added up in memory, per card per holder and per card
    store      the tables: a minute written, minutes rolled up into hours, format 1 upgraded
    ledger     the SQLite file and the thread that writes it
    recorder   who records (flock roles: a watch, else one TUI) and the per-sample feed
    queries    the report's numbers from the ledger
    report     the report document: tables, CSV, plots, hosts merged
"""

from __future__ import annotations

from gpumon.owners.holders import HolderTracker
from gpumon.usage.recorder import UsageRecorder
from gpumon.usage.settings import history_settings


def usage_recorder(history: dict | None, role: str, tracker: HolderTracker | None = None) -> UsageRecorder | None:
    """The recorder the config's [history] asks for, started (None: `record = false`). A bad
    [history] value raises UsageError; a ledger that cannot be written only logs."""
    settings = history_settings(history)
    if not settings.record:
        return None
    return UsageRecorder(settings, tracker or HolderTracker(), role).start()
