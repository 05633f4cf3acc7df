"""`gpumon alerts export --prometheus-rules`: the configured rules as a Prometheus rules file."""

from __future__ import annotations

import argparse
import sys

from gpumon.alerting.prometheus_rules import prometheus_rules
from gpumon.alerting.rules import parse_rules
from gpumon.cli.common import load_settings
from gpumon.errors import EXIT_OK


def run(args: argparse.Namespace) -> int:
    config = load_settings(args).config
    sys.stdout.write(prometheus_rules(parse_rules(config.watch_rules + config.rules + args.alert)))
    return EXIT_OK
