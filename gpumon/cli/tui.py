"""`gpumon` with no command: the interactive monitor."""

from __future__ import annotations

import argparse
import signal
import sys

from gpumon.cli import STARTUP_ENVIRONMENT, splash
from gpumon.cli.asyncio_without_tls import import_asyncio_without_tls
from gpumon.cli.common import filesystem_roots, fleet_requested, open_source
from gpumon.cli.open_driver_early import EarlyOpen
from gpumon.config import Config, load_config
from gpumon.errors import UsageError


def run(args: argparse.Namespace) -> int:
    nvml = not (args.demo or args.scenario is not None or args.replay is not None)
    many = bool(args.hosts or args.hostfile)
    # Until the app takes SIGTERM over (it then leaves as `q` does), leave through the `finally`s
    # and `except`s below, which put the terminal back, rather than die on the alternate screen.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    take_down = splash.show("connecting to the hosts…" if many else
                            "opening the NVIDIA driver…" if nvml else "starting…")
    try:
        # Only the file itself before the driver opens: checking it (alert and health rules,
        # sharing, job records) imports a third of the start path, and waits until the names are up.
        config = load_config(args.config)
        filesystem_roots(args, config)
        fleet, settings = _fleet(args, config)
    except BaseException:
        take_down()
        raise
    if fleet is not None:
        from gpumon.tui.fleet.app import run_fleet_app

        return run_fleet_app(args, fleet, on_error=take_down, env=STARTUP_ENVIRONMENT,
                             on_alternate_screen=splash.is_up(), sharing=settings.sharing)
    identity = None
    try:
        if nvml:
            # The driver opens while Textual loads; the card names make the first frame.
            opening = EarlyOpen(lambda: open_source(args, _health_for_the_driver(config)))
            identity = opening.identity()
            if identity is not None:
                splash.cards(identity)
            elif opening.failed:  # no driver: say so now, not after Textual has started
                opening.backend()
        import_asyncio_without_tls()
        # Imported here, after the first frame is up: Textual takes most of gpumon's start-up.
        from gpumon.alerting.rules import missing_cards, parse_rules
        from gpumon.cli.common import backend_args, load_settings
        from gpumon.tui.app import run_app
        from gpumon.usage import usage_recorder

        settings = load_settings(args, config)
        rules = parse_rules(config.rules + config.watch_rules + args.alert)
        if identity is not None and (problem := missing_cards(rules, identity)):  # else the first sample says
            raise UsageError(problem)
        args.theme_given = args.theme is not None  # --theme: it wins over the theme chosen in the TUI last time
        args.theme = args.theme or config.theme
        args.readonly = args.readonly or config.readonly
        opened = backend_args(args)
        # Who used the cards, kept where no watch keeps it (not of the demo or a replay).
        usage = usage_recorder(config.history, "tui") if nvml else None
        if not nvml:
            backend, opener = open_source(args, settings.health), None
        else:
            # The NVIDIA driver can take seconds to start (persistence mode off, a card going bad):
            # the app waits for it in a thread, after its first frame.
            backend, opener = None, opening.backend
    except BaseException:
        take_down()
        raise
    return run_app(args, backend, rules, opened, opener=opener, on_error=take_down, env=STARTUP_ENVIRONMENT,
                   identity=identity, on_alternate_screen=splash.is_up(), usage=usage, settings=settings)


def _health_for_the_driver(config: Config):
    """The config's [health], for the driver opened before the settings are built (in the opener's
    thread: the health rules come with the backend anyway). A bad table opens it with the defaults:
    the settings say what is wrong, in their turn, and the start ends there."""
    from gpumon.health.rules import HealthSettings, configured_settings

    try:
        return configured_settings(config)
    except UsageError:
        return HealthSettings()


def _fleet(args: argparse.Namespace, config: Config):
    """The fleet to show when hosts are given (--hosts, --hostfile, or the config's [fleet] hosts
    unless an option asks for this machine alone: --local, --demo, --replay, --record), with the
    run's settings; (None, None) otherwise. Only then are the fleet's modules imported: a
    single-machine start does not grow."""
    one_machine = args.local or args.demo or args.scenario is not None or args.replay or args.record
    configured = (config.fleet_hosts or config.fleet_prometheus_url) and not one_machine
    if not fleet_requested(args) and not configured:
        return None, None
    import_asyncio_without_tls()
    from gpumon.cli.common import load_settings
    from gpumon.cli.fleet import build, host_list, prometheus_url

    settings = load_settings(args, config)
    args.theme_given = args.theme is not None
    args.theme = args.theme or config.theme
    args.readonly = args.readonly or config.readonly
    return build(args, settings, host_list(args, config, use_config=True),
                 prometheus_url(args, config, use_config=True)), settings
