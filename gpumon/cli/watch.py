"""`gpumon watch`: headless sampling, alert rules, hooks, Prometheus."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import TYPE_CHECKING

from gpumon.alerting.events import EventWriter
from gpumon.alerting.holder_rules import needs_processes
from gpumon.alerting.hooks import HookRunner
from gpumon.alerting.rules import AlertEngine, parse_rules
from gpumon.alerting.watch import Watch
from gpumon.cards.recording import Recorder
from gpumon.cards.sampler import Sampler
from gpumon.cli.common import fleet_requested, load_settings, open_source, xid_state_file
from gpumon.health.seen_xids import XidStateWriter
from gpumon.jobs.supervision.job_events import EventFollower
from gpumon.usage import usage_recorder

if TYPE_CHECKING:
    from gpumon.settings import Settings
    from gpumon.sharing.folder import SharingSettings


def run(args: argparse.Namespace) -> int:
    if args.on_alert is not None and not args.on_alert.strip():  # `sh -c ''` per event would do nothing
        from gpumon.errors import UsageError

        raise UsageError("--on-alert: the command is empty (give a shell command line)")
    settings = load_settings(args)
    config = settings.config
    rules = parse_rules(config.watch_rules + config.rules + args.alert)
    fmt = args.format or config.format or ("text" if sys.stdout.isatty() else "jsonl")
    web = _web_config(args.web_config_file or config.web_config_file, args.prometheus or config.prometheus)
    if fleet_requested(args):
        return _watch_hosts(args, settings, rules, fmt, web)
    backend = open_source(args, settings.health)
    replaying = args.replay is not None
    count = args.count
    if replaying:  # as fast as the data comes: rule durations use the recorded times
        remaining = len(backend.snapshots)
        count = min(count, remaining) if count else remaining
    on_alert = args.on_alert or config.on_alert
    hooks = HookRunner(on_alert, args.hook_timeout or config.hook_timeout) if on_alert else None
    recorder = Recorder(args.record) if args.record else None
    per_process = args.prometheus_processes or config.prometheus_processes
    address = args.prometheus or config.prometheus
    # Card events never name processes: psutil is needed only to record them, to export (a card's
    # series name the job or pod holding it, as dcgm-exporter's do), or to know who holds the cards
    # (idle rules).
    # Who used the cards (the usage ledger), read by the same tracker as the idle rules; not of a
    # replay or the demo (neither happened on this machine).
    usage = None if replaying or backend.name == "demo" else usage_recorder(config.history, "watch")
    enrich = recorder is not None or bool(address) or needs_processes(rules) or usage is not None
    sampler = Sampler(backend, interval=0.0 if replaying else args.interval, enrich=enrich, owners=settings.host_paths)
    watch = Watch(
        sampler, AlertEngine(rules, tracker=usage.tracker if usage is not None else None,
                             without_claim=None if replaying else _without_claim(settings.sharing)),
        EventWriter(sys.stdout, fmt), hooks, recorder, args.exit_on_alert, args.metrics, count,
        # Jobs of this user on this host that move to other cards; a replay has none.
        job_events=None if replaying else _job_and_reservation_events(sampler, settings.sharing),
        usage=usage.feed if usage is not None else None,
    )
    if not replaying and backend.xid_events:  # what `gpumon health` reads of the XIDs before it
        watch.xid_state = XidStateWriter(xid_state_file(config))
    server = None
    try:
        if address:
            server = watch.serve_prometheus(address, per_process, _hostname(args, config), web, settings.sharing)
        return asyncio.run(watch.run())
    finally:
        if watch.xid_state is not None:
            watch.xid_state.close()
        if server is not None:
            server.shutdown()
        if hooks is not None:
            hooks.close()
        if recorder is not None:
            recorder.close()
        if usage is not None:
            usage.close()
        backend.close()


def _web_config(path: str | None, address: str | None):
    """--web-config-file (or the config's), read before anything starts: a bad one is one line and
    exit status 2."""
    if path is None:
        return None
    from gpumon.errors import UsageError
    from gpumon.exporter.web_config import load_web_config

    if not address:
        raise UsageError("--web-config-file secures the exporter: give --prometheus ADDR too")
    return load_web_config(path)


def _without_claim(sharing: SharingSettings):
    """For `unclaimed` rules: the processes on cards others claim or reserved here, as the place
    was last read (in a thread, every 2 s at most)."""
    from gpumon.sharing.view import SharingNow

    seen = SharingNow(sharing)

    def on_others_cards(snapshot):
        seen.current(snapshot)
        return seen.without_claim(snapshot)

    return on_others_cards


def _job_and_reservation_events(sampler: Sampler, sharing: SharingSettings):
    """Jobs of this user on this host that moved to other cards, and reservations of this host
    that ended by themselves (gpumon/sharing; judged on the newest sample): news once per sample."""
    from gpumon.sharing.view import ReservationFollower

    jobs, reservations = EventFollower(), ReservationFollower(socket.gethostname(), sharing)
    reservations.read_new(None)  # what ended before watch started is not news
    return lambda: [*jobs.read_new(), *reservations.read_new(sampler.latest)]


def _hostname(args: argparse.Namespace, config) -> str | None:
    """--prometheus-hostname: the name a Prometheus reader shows this host by."""
    name = args.prometheus_hostname if args.prometheus_hostname is not None else config.prometheus_hostname
    if name is not None and (not name.strip() or not name.isprintable() or len(name) > 256):
        from gpumon.errors import UsageError

        raise UsageError(f"bad --prometheus-hostname {name!r}: expected a host name")
    return name


def _watch_hosts(args: argparse.Namespace, settings: Settings, rules, fmt: str, web=None) -> int:
    from gpumon.alerting.fleet_watch import FleetWatch
    from gpumon.cli import fleet
    from gpumon.errors import UsageError

    if args.prometheus_hostname is not None:
        raise UsageError("--prometheus-hostname names one machine: with --hosts each host's Hostname is its name "
                         "in the host list")
    config = settings.config
    runner = fleet.build(args, settings, fleet.host_list(args, config))
    on_alert = args.on_alert or config.on_alert
    hooks = HookRunner(on_alert, args.hook_timeout or config.hook_timeout) if on_alert else None
    watch = FleetWatch(runner, rules, EventWriter(sys.stdout, fmt, show_hosts=True), hooks, args.exit_on_alert,
                       args.metrics, args.count)
    server = None
    try:
        address = args.prometheus or config.prometheus
        if address:  # every host's cards from this one exporter
            server = watch.serve_prometheus(address, args.prometheus_processes or config.prometheus_processes, web)
        return asyncio.run(watch.run())
    finally:
        if server is not None:
            server.shutdown()
        if hooks is not None:
            hooks.close()
