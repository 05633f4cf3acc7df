"""`gpumon snapshot [--json]`: one sample of every card (of every host, with --hosts), within
--timeout (cards that have not answered by then are shown as not responding)."""

from __future__ import annotations

import argparse

from gpumon.cards.sampler import sample_once
from gpumon.cli.common import fleet_requested, print_document, read_once
from gpumon.cli.tables import snapshot_text


def run(args: argparse.Namespace) -> int:
    if args.stream:
        from gpumon.cli.stream import run_stream

        return run_stream(args)
    if fleet_requested(args):
        from gpumon.cli.fleet_commands import snapshot_hosts

        return snapshot_hosts(args)
    return print_document(args, read_once(args, lambda backend, left: sample_once(backend, wait_s=left)), snapshot_text)
