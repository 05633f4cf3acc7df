"""`gpumon reserve --gpu N[,M…] --for DURATION [--note TEXT]`, `gpumon reserve --list [--json]`:
book this host's cards for a while (gpumon/sharing/reservations.py). Everyone else's auto
placement, `select` and queue skip a reserved card; the holder's prefer it. Advisory: CUDA work
started outside gpumon is not stopped."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

from gpumon.cards.sampler import sample_once
from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.errors import EXIT_OK, UsageError
from gpumon.jobs.placement import resolve_spec
from gpumon.model import GpuSample
from gpumon.sanitize import printable
from gpumon.settings import Settings
from gpumon.sharing import claims, reservations
from gpumon.sharing.folder import SharingSettings, Unavailable, ensure
from gpumon.units import format_duration, format_time


def cards_named(args: argparse.Namespace, settings: Settings, spec: str) -> list[GpuSample]:
    """The cards `--gpu` names (indices, UUIDs, bus ids; not auto), read once from the driver."""
    if spec.strip().startswith("auto"):
        raise UsageError(f"bad --gpu {spec!r}: name the cards to reserve (N[,M...]), not auto")
    backend = open_source(args, settings.health, timeout=args.timeout)
    try:
        snapshot = sample_once(backend, args.timeout, settings.host_paths)
    finally:
        backend.close()
    return resolve_spec(spec, snapshot)


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):  # each host reserves its own cards
        return _on_hosts(args)
    settings = load_settings(args)
    shared = settings.sharing
    if args.list:
        if args.gpu or args.duration is not None or args.note is not None:
            raise UsageError("--list lists the host's reservations: not with --gpu, --for or --note")
        return _list(shared, args.json)
    if args.json:
        raise UsageError("--json goes with --list")
    if not args.gpu or args.duration is None:
        raise UsageError("reserve needs --gpu N[,M...] and --for DURATION (or --list)")
    if not 0 < args.duration <= reservations.LONGEST_S:
        raise UsageError(f"--for {format_duration(args.duration)} is too long: a reservation lasts at most a week (7d)")
    note = args.note or ""
    if len(note) > reservations.MAX_NOTE:
        raise UsageError(f"--note is {len(note)} characters long: at most {reservations.MAX_NOTE}")
    gpus = cards_named(args, settings, args.gpu)
    until = time.time() + args.duration
    directory = shared.directory
    try:
        ensure(directory)
        booked = reservations.read(directory, idle_release=shared.idle_release_s)
        theirs = [f"GPU {g.index} is {booked[g.ref].words()}" for g in gpus
                  if g.ref in booked and not booked[g.ref].mine]
        if theirs:
            raise UsageError("; ".join(theirs))
        reservations.release(booked, {g.ref for g in gpus})  # ours again: the new time stands
        made = reservations.reserve(directory, [(g.ref, g.index) for g in gpus], until, note,
                                    shared.recorded_idle_release)
        # Another booking of these cards made at the same moment: neither may think it won, so
        # whoever sees the other's withdraws (both, if both do: one tries again).
        now = reservations.read(directory, idle_release=shared.idle_release_s)
        rivals = [f"GPU {g.index} was just {now[g.ref].words()}" if g.ref in now
                  else f"GPU {g.index}'s reservation did not read back (its file changed as it was made)"
                  for g in gpus if g.ref not in now or not now[g.ref].mine]
        if rivals:
            for path in made:
                reservations.withdraw(path)
            raise UsageError("; ".join(rivals) + "; nothing was reserved")
        held = claims.read(directory)
    except Unavailable as exc:
        raise UsageError(f"cannot reserve: {exc}") from None
    for g in gpus:
        print(f"reserved GPU {g.index} ({g.ref}) until {format_time(until)} ({format_duration(args.duration)})"
              + (f": {printable(note)}" if note else ""))
        for claim in held.get(g.ref, []):
            print(f"gpumon: note: GPU {g.index} is {claim.words()} (running jobs are not stopped)", file=sys.stderr)
    return EXIT_OK


def _on_hosts(args: argparse.Namespace) -> int:
    from gpumon.cli.sharing_hosts import as_they_answer, documents, on_each_host, print_as_they_answer

    if args.list:
        if args.json:
            doc, status = documents(on_each_host(args, ["reserve", "--list", "--json"]), "reservations")
            json.dump(doc, sys.stdout)
            sys.stdout.write("\n")
            return status
        return print_as_they_answer(as_they_answer(args, ["reserve", "--list"]))
    if not args.gpu or args.duration is None:
        raise UsageError("reserve needs --gpu N[,M...] and --for DURATION (or --list)")
    argv = ["reserve", "--gpu", args.gpu, "--for", f"{round(args.duration, 3)}s"]
    return print_as_they_answer(as_they_answer(args, argv + (["--note", args.note] if args.note else [])))


def _list(shared: SharingSettings, as_json: bool) -> int:
    directory = shared.directory
    found = reservations.read(directory, idle_release=shared.idle_release_s) if directory.is_dir() else {}
    listed = sorted(found.values(), key=lambda r: (r.index if r.index is not None else 1 << 30, r.card))
    if as_json:
        json.dump({"schema": 1, "host": socket.gethostname(), "time": time.time(),
                   "reservations": [r.to_dict() for r in listed]}, sys.stdout)
        sys.stdout.write("\n")
        return EXIT_OK
    if not listed:
        print("no cards are reserved on this host")
    for r in listed:
        card = f"GPU {r.index}" if r.index is not None else printable(r.card)
        print(f"{card}  {r.words()}")
    return EXIT_OK
