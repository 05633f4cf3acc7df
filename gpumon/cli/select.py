"""`gpumon select`: a CUDA_VISIBLE_DEVICES value (UUIDs) for the best free cards."""

from __future__ import annotations

import argparse
import sys
import time

from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.errors import EXIT_ALERT, EXIT_OK
from gpumon.jobs.placement import TooFewFree, choose
from gpumon.monitor.sampler import read_topology, sample_once


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):
        from gpumon.cli.fleet_commands import select_hosts

        return select_hosts(args)
    load_settings(args)
    deadline = time.monotonic() + args.timeout
    backend = open_source(args, timeout=args.timeout)
    try:
        # A card that does not answer in time is "not responding", never waited for past --timeout.
        snapshot = sample_once(backend, wait_s=max(0.0, deadline - time.monotonic()))
        topo = read_topology(backend, max(0.0, deadline - time.monotonic())) if args.count > 1 else None
    finally:
        backend.close()
    try:
        choice = choose(snapshot, args.count, topo, min_free=args.min_free, max_util=args.max_util,
                        max_used=args.max_used)
    except TooFewFree as exc:
        if args.verbose:
            _explain(exc.reasons)
        print(f"gpumon: {exc}", file=sys.stderr)
        return EXIT_ALERT  # like grep: ran fine, found nothing
    if args.verbose:
        _explain(choice.reasons)
    print(",".join(g.uuid or "" for g in choice.gpus))
    return EXIT_OK


def _explain(reasons) -> None:
    for reason in reasons:
        print(f"gpumon: {reason}", file=sys.stderr)
