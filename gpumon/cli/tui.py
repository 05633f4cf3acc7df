"""`gpumon` with no command: the interactive monitor."""

from __future__ import annotations

import argparse

from gpumon.alerting.rules import parse_rules
from gpumon.cli import STARTUP_ENVIRONMENT
from gpumon.cli.common import backend_args, fleet_requested, load_settings, open_source
from gpumon.errors import UsageError
from gpumon.tui.app import run_app


def run(args: argparse.Namespace) -> int:
    config = load_settings(args)
    if fleet_requested(args):  # the fleet view builds on gpumon.monitor.fleet (its TUI part is next)
        raise UsageError("the TUI shows this machine only, for now: for many hosts use "
                         "gpumon snapshot, watch, select or jobs with --hosts")
    rules = parse_rules(config.rules + config.watch_rules + args.alert)
    args.theme = args.theme or config.theme
    args.readonly = args.readonly or config.readonly
    return run_app(args, open_source(args), rules, backend_args(args), env=STARTUP_ENVIRONMENT)
