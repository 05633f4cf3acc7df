"""`gpumon release [--gpu N[,M…]]`: end your reservations on this host (all, or those cards')."""

from __future__ import annotations

import argparse

from gpumon.cli.common import fleet_requested, load_settings
from gpumon.cli.reserve import cards_named
from gpumon.errors import EXIT_OK
from gpumon.sharing import reservations
from gpumon.units import format_time


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):  # each host's own reservations of yours
        from gpumon.cli.sharing_hosts import as_they_answer, print_as_they_answer

        return print_as_they_answer(as_they_answer(args, ["release", *(["--gpu", args.gpu] if args.gpu else [])]))
    settings = load_settings(args)
    cards = {g.ref for g in cards_named(args, settings, args.gpu)} if args.gpu else None
    directory = settings.sharing.directory
    found = reservations.read(directory, idle_release=settings.sharing.idle_release_s) if directory.is_dir() else {}
    gone = reservations.release(found, cards)
    if not gone:
        print("you hold no reservation here" + (" of those cards" if cards else ""))
    for r in sorted(gone, key=lambda r: r.index if r.index is not None else 1 << 30):
        print(f"released GPU {r.index if r.index is not None else r.card} (reserved until {format_time(r.until)})")
    return EXIT_OK
