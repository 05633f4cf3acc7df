"""`gpumon snapshot [--json]`: one sample of every card (of every host, with --hosts), within
--timeout (cards that have not answered by then are shown as not responding)."""

from __future__ import annotations

import argparse
import json
import sys

from gpumon.cards.sampler import sample_once
from gpumon.cli.common import fleet_requested, load_settings, print_document, read_once
from gpumon.cli.tables import snapshot_text
from gpumon.errors import EXIT_OK
from gpumon.sharing import view


def run(args: argparse.Namespace) -> int:
    if args.stream:
        from gpumon.cli.stream import run_stream

        return run_stream(args)
    if fleet_requested(args):
        from gpumon.cli.fleet_commands import snapshot_hosts

        return snapshot_hosts(args)
    settings = load_settings(args)
    snapshot = read_once(args, settings, lambda backend, left: sample_once(backend, left, settings.host_paths))
    # Each card's claims and reservation (gpumon/sharing): in the document, and under the table.
    shares = view.per_card(settings.sharing.directory, snapshot, settings.sharing.idle_release_s)
    if args.json:
        json.dump(view.annotate(snapshot.to_dict(), shares), sys.stdout)
        sys.stdout.write("\n")
        return EXIT_OK
    shared = {g.index: view.card_words(view.of(g, shares))[0] for g in snapshot.gpus}
    return print_document(args, snapshot, lambda s: snapshot_text(s, shared))
