"""`gpumon select`: a CUDA_VISIBLE_DEVICES value (UUIDs) for the best free cards."""

from __future__ import annotations

import argparse
import sys

from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.errors import EXIT_ALERT, EXIT_OK
from gpumon.jobs.placement import choose
from gpumon.monitor.sampler import sample_once


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):
        from gpumon.cli.fleet_commands import select_hosts

        return select_hosts(args)
    load_settings(args)
    backend = open_source(args)
    try:
        snapshot = sample_once(backend)
        topo = backend.topology() if args.count > 1 else None
    finally:
        backend.close()
    try:
        choice = choose(snapshot, args.count, topo, min_free=args.min_free, max_util=args.max_util)
    except ValueError as exc:
        print(f"gpumon: {exc}", file=sys.stderr)
        return EXIT_ALERT  # like grep: ran fine, found nothing
    if args.verbose:
        for reason in choice.reasons:
            print(f"gpumon: {reason}", file=sys.stderr)
    print(",".join(g.uuid for g in choice.gpus))
    return EXIT_OK
