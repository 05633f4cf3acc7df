"""`gpumon` with no command: the interactive monitor."""

from __future__ import annotations

import argparse

from gpumon.cli import STARTUP_ENVIRONMENT, splash
from gpumon.cli.early_open import EarlyOpen


def run(args: argparse.Namespace) -> int:
    nvml = not (args.demo or args.scenario is not None or args.replay is not None)
    take_down = splash.show("opening the NVIDIA driver…" if nvml else "starting…")
    identity = None
    try:
        if nvml:
            # The driver opens while Textual loads; the card names make the first frame.
            from gpumon.cli.common import open_source

            opening = EarlyOpen(lambda: open_source(args))
            identity = opening.identity()
            if identity is not None:
                splash.cards(identity)
            elif opening.failed:  # no driver: say so now, not after Textual has started
                opening.backend()
        # Imported here, after the first frame is up: Textual takes most of gpumon's start-up.
        from gpumon.alerting.rules import parse_rules
        from gpumon.cli.common import backend_args, fleet_requested, load_settings, open_source
        from gpumon.errors import UsageError
        from gpumon.tui.app import run_app

        config = load_settings(args)
        if fleet_requested(args):  # the fleet view builds on gpumon.monitor.fleet (its TUI part is next)
            raise UsageError("the TUI shows this machine only, for now: for many hosts use "
                             "gpumon snapshot, watch, select or jobs with --hosts")
        rules = parse_rules(config.rules + config.watch_rules + args.alert)
        args.theme = args.theme or config.theme
        args.readonly = args.readonly or config.readonly
        opened = backend_args(args)
        if not nvml:
            backend, opener = open_source(args), None
        else:
            # The NVIDIA driver can take seconds to start (persistence mode off, a card going bad):
            # the app waits for it in a thread, after its first frame.
            backend, opener = None, opening.backend
    except BaseException:
        take_down()
        raise
    return run_app(args, backend, rules, opened, opener=opener, on_error=take_down, env=STARTUP_ENVIRONMENT,
                   identity=identity)
