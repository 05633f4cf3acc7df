"""`gpumon report [--since 7d | --from … --to …] [--by user|job|card|day] [--json|--csv] [--plot]`:
who used the cards, from this machine's usage ledger (gpumon/usage/), every host's (`--hosts`: each
host's own `gpumon report --json` over ssh, merged), or a Prometheus server's history
(`--prometheus-url`: range queries over what it scraped of gpumon or dcgm-exporter)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from gpumon.cli.common import fleet_requested, load_settings
from gpumon.errors import EXIT_OK, UsageError
from gpumon.usage import report
from gpumon.usage.report import LedgerError
from gpumon.usage.settings import history_settings

DEFAULT_SINCE_S = 7 * 86400.0
REMOTE_TIMEOUT_S = 60.0
AT_ONCE = 32


def window(args: argparse.Namespace, now: float) -> tuple[float, float]:
    end = args.end if args.end is not None else now
    start = args.start if args.start is not None else end - (args.since or DEFAULT_SINCE_S)
    if start >= end:
        raise UsageError(f"--from must be before --to: {_iso(start)} is not before {_iso(end)}")
    return start, end


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def run(args: argparse.Namespace) -> int:
    config = load_settings(args).config
    settings = history_settings(config.history)
    start, end = window(args, time.time())
    if fleet_requested(args):
        if args.prometheus_url:
            if args.hosts or args.hostfile:
                raise UsageError("--prometheus-url answers from the cluster's history: not with --hosts")
            if args.by in ("card", "day"):
                raise UsageError(f"--by {args.by} with --prometheus-url: Prometheus' report has rows per user and "
                                 "job (its cards and days are in the report's card table and --plot)")
            from gpumon.usage.prometheus_report import prometheus_report

            doc = prometheus_report(args.prometheus_url, start, end, args.by, settings.price_per_kwh,
                                    config.fleet_prometheus_user, config.fleet_prometheus_password_file)
        else:
            doc = _hosts_report(args, config, start, end, settings.price_per_kwh)
    else:
        doc = report.ledger_report(settings, start, end, args.by)
    return _print(args, doc)


def _print(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(doc))
    elif args.csv:
        sys.stdout.write(report.csv_text(doc))
    else:
        print(report.text(doc))
        if args.plot:
            print()
            print(report.plot(doc))
    return EXIT_OK


def _hosts_report(args: argparse.Namespace, config, start: float, end: float, price: float | None) -> dict[str, Any]:
    """Each host's own report (its ledger), asked at once over the fleet's ssh, merged."""
    from gpumon.cli import fleet
    from gpumon.jobs.host import HostError, host_at

    hosts = fleet.host_list(args, config)
    if not hosts:
        raise UsageError("--hosts names no host")
    transport = fleet.transport(args, config) if any(not h.is_local for h in hosts) else None
    command = ["report", "--json", "--from", repr(start), "--to", repr(end), "--by", args.by]

    def ask(spec) -> tuple[str, dict[str, Any] | None, str | None]:
        try:
            text = host_at(spec, transport, fleet.local_args(args) if spec.is_local else ()).call(command,
                                                                                                 REMOTE_TIMEOUT_S)
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("schema") != 1:
                return spec.name, None, f"{spec.name}: `gpumon report --json` answered something else"
            return spec.name, doc, None
        except HostError as exc:
            return spec.name, None, str(exc)
        except ValueError:
            return spec.name, None, f"{spec.name}: `gpumon report --json` did not answer with JSON"

    answered: dict[str, tuple[dict[str, Any] | None, str | None]] = {}
    with ThreadPoolExecutor(max_workers=min(AT_ONCE, len(hosts))) as pool:
        for future in as_completed([pool.submit(ask, spec) for spec in hosts]):
            name, doc, error = future.result()
            answered[name] = (doc, error)
            if error:  # at once: the other hosts may take their whole timeout
                print(f"gpumon: {error}", file=sys.stderr, flush=True)
    reports = {spec.name: answered[spec.name][0] for spec in hosts}  # in the order listed
    errors = {spec.name: answered[spec.name][1] for spec in hosts if answered[spec.name][1]}
    if len(errors) == len(hosts):
        raise LedgerError("no host answered with its usage history")
    return report.merge(reports, errors, start, end, args.by, price)
