"""`gpumon report`'s options (beside parser.py, which names the subcommand and hands over its
helpers: a module of its own keeps the grammar under the size rule)."""

from __future__ import annotations

import argparse

from gpumon.errors import UsageError

BY = ("user", "job", "card", "day")


def _span(text: str) -> float:
    from gpumon.units import parse_duration

    try:
        return parse_duration(text, "--since", above_zero=True)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("bad --since ")) from None


def _when(text: str) -> float:
    from gpumon.usage.settings import parse_when

    try:
        return parse_when(text, "time")
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("bad time ")) from None


def _by(text: str) -> str:
    if text not in BY:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(BY)}")
    return text


def add_report(sub, add_config_option, add_fleet_options) -> None:
    p = sub.add_parser("report", help="who used the cards: GPU-hours, energy, idle-held hours per user, job, card, day",
                       description="Reads the usage history `gpumon watch` (or the TUI, where no watch runs) "
                                   "records ([history] in the config), or a Prometheus server's. GPU-hours are "
                                   "card-hours held; idle-held hours: held with every process at 0 % SM. Exit "
                                   "status 1 when there is no history to read.")
    when = p.add_mutually_exclusive_group()
    when.add_argument("--since", type=_span, metavar="SPAN", help="the last SPAN: 30m, 12h, 7d, 2w (default 7d)")
    when.add_argument("--from", dest="start", type=_when, metavar="WHEN",
                      help="from this date or time: 2026-12-01, 2026-12-01T14:00 (local time), or unix seconds")
    p.add_argument("--to", dest="end", type=_when, metavar="WHEN", help="until this date or time (default: now)")
    p.add_argument("--by", type=_by, default="user", metavar="WHAT",
                   help="rows per user (with their jobs, pods, containers), job, card or day (default user)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the report as JSON")
    out.add_argument("--csv", action="store_true", help="the rows as CSV")
    out.add_argument("--plot", action="store_true", help="also draw each card's utilisation per day")
    add_config_option(p, suppress=True)
    add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="report")
