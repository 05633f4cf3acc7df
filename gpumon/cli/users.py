"""`gpumon users [--json] [--hosts …] [--window DURATION]`: who holds the cards, per user and per
Slurm job, Kubernetes pod or container (owners/holders.py), on this machine or every host.

Idle time needs watching: gpumon cannot know what a process did before it looked, so the command
samples for --window (default two intervals: three samples) and prints the holders as the last
sample found them. Their idle time and energy are what that window saw.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from gpumon.cards.sampler import Sampler
from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.cli.tables import HOST_CELLS, USERS_HEADER, USERS_RIGHT, USERS_WIDTHS, fixed_lines, users_rows, users_text
from gpumon.errors import EXIT_OK, UsageError
from gpumon.model import HostStatus, Snapshot
from gpumon.owners.holders import Holder, HolderTracker, users_document
from gpumon.owners.reader import HostPaths
from gpumon.sanitize import printable
from gpumon.settings import Settings
from gpumon.sharing.folder import SharingSettings
from gpumon.sharing.view import per_card, reservations_text, uses_without_claim
from gpumon.units import format_duration

DEFAULT_SAMPLES = 3


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    if fleet_requested(args):
        return _fleet(args, settings)
    window = _window(args, args.interval)
    backend = open_source(args, settings.health)
    try:
        holders, watched, latest = asyncio.run(_watch_host(args, backend, window, settings.host_paths))
    finally:
        backend.close()
    return _print(args, holders, watched, None, latest.time, settings.sharing, latest)


def _window(args: argparse.Namespace, interval: float) -> float:
    return args.window if args.window is not None else (DEFAULT_SAMPLES - 1) * interval


async def _watch_host(args: argparse.Namespace, backend: Any, window: float,
                      owners: HostPaths) -> tuple[tuple[Holder, ...], float, Snapshot]:
    """Sample until the samples span `window` (by their own times: a replay goes as fast as it reads)."""
    replaying = getattr(args, "replay", None) is not None
    interval = 0.0 if replaying else args.interval
    sampler = Sampler(backend, interval=interval, enrich=True, owners=owners)  # holders need each process's owner
    tracker = HolderTracker()
    seen: dict[str, Any] = {"holders": (), "first": None, "last": None}

    def on_snapshot(snapshot: Snapshot) -> None:
        if snapshot.stale:
            return
        seen["holders"] = tracker.update(snapshot)
        seen["first"] = seen["first"] if seen["first"] is not None else snapshot.time
        seen["last"], seen["latest"] = snapshot.time, snapshot
        if snapshot.time - seen["first"] >= window - interval / 2:  # sampling times jitter
            sampler.stop()

    sampler.subscribe(on_snapshot)
    await sampler.run(len(backend.snapshots) if replaying else None)
    if seen["last"] is None:
        raise UsageError("no sample to read holders from (an empty recording?)")
    return seen["holders"], seen["last"] - seen["first"], seen["latest"]


Answer = tuple[HostStatus, tuple[Holder, ...]]  # a host's status when it was done with, its holders then


def _fleet(args: argparse.Namespace, settings: Settings) -> int:
    """Every host's holders, each host printed once it has been watched for the window (or has
    failed), as it comes: a slow host holds up no other. --json: one document at the end."""
    from gpumon.cli import fleet

    if getattr(args, "replay", None):
        raise UsageError("--replay reads one machine: not with --hosts")
    hosts = fleet.host_list(args, settings.config)
    runner = fleet.build(args, settings, hosts)
    text = None if args.json else _HostsText(min(HOST_CELLS, max((len(h.name) for h in hosts), default=HOST_CELLS)))
    answers, watched = asyncio.run(_watch_fleet(runner, _window(args, runner.interval),
                                                text.host if text is not None else None))
    if problems := runner.problems():  # the Prometheus server could not be read, or knows no GPU
        raise UsageError("; ".join(problems))
    order = [name for name in runner.names if name in answers]
    statuses = tuple(answers[name][0] for name in order)
    if text is not None:
        text.end(watched)
    else:
        _print(args, [h for name in order for h in answers[name][1]], watched, statuses, sharing=settings.sharing)
    return fleet.read_status(statuses)


class _HostsText:
    """`users --hosts` for people: each host's rows as it is done with, in fixed columns under one
    header; a host that could not be read, one line; the window watched at the end."""

    def __init__(self, host_cells: int) -> None:
        self.widths = [host_cells, *USERS_WIDTHS]
        self.rows = 0

    def host(self, name: str, status: HostStatus, holders: tuple[Holder, ...]) -> None:
        from gpumon.cli.fleet import was_read

        if not was_read(status):
            entry = status.to_dict()
            out = printable(f"{name}: {entry['state']}: {entry['error'] or '?'} (not read)") + "\n"
        else:
            rows = users_rows(holders, show_hosts=True)
            out = fixed_lines(([["HOST", *USERS_HEADER]] if rows and not self.rows else []) + rows, self.widths,
                              {1 + i for i in USERS_RIGHT})
            self.rows += len(rows)
        sys.stdout.write(out)
        sys.stdout.flush()

    def end(self, watched: float) -> None:
        sys.stdout.write(("" if self.rows else "Nobody holds a card.\n") + _watched_line(watched))


async def _watch_fleet(runner: Any, window: float,
                       on_answer: Callable[[str, HostStatus, tuple[Holder, ...]], None] | None
                       ) -> tuple[dict[str, Answer], float]:
    """Each host's holders once its own samples span `window` (hosts run on their own clocks and
    intervals), or why it could not be read; `on_answer` hears each host as it is done with. A
    host still short of the window a few intervals after it should have been is taken as it is."""
    from gpumon.cli.fleet import settle_timeout, was_read

    tracker = HolderTracker()
    held: dict[str, tuple[Holder, ...]] = {}
    span: dict[str, list[float]] = {}  # host -> [first sample's time, last sample's time]
    answers: dict[str, Answer] = {}

    def done(status: HostStatus, holders: tuple[Holder, ...]) -> None:
        answers[status.host] = (status, holders)
        if on_answer is not None:
            on_answer(status.host, status, holders)

    def on_host(status: HostStatus) -> None:
        if status.state != "live" or status.snapshot is None or status.host in answers:
            return
        held[status.host] = tracker.update(status.snapshot, status.host)
        times = span.setdefault(status.host, [status.snapshot.time, status.snapshot.time])
        times[1] = status.snapshot.time
        if times[1] - times[0] >= window - runner.interval / 2:  # sampling times jitter
            done(status, held[status.host])

    def on_first(status: HostStatus) -> None:
        if not was_read(status) and status.host not in answers:
            done(status, ())

    runner.subscribe(on_host)
    runner.on_first_answer(on_first)
    task = asyncio.create_task(runner.run())
    try:
        await runner.settle(settle_timeout(runner.interval))
        deadline = time.monotonic() + window + 3 * runner.interval
        while len(answers) < len(runner.names) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        runner.stop()
        await task
    for name in runner.names:  # short of the window, or away by now
        if name not in answers:
            done(runner.status(name), held.get(name, ()) if was_read(runner.status(name)) else ())
    read = [last - first for name, (first, last) in span.items() if was_read(answers[name][0])]
    return answers, min(read, default=0.0)


def _print(args: argparse.Namespace, holders: Any, watched: float, statuses: tuple[HostStatus, ...] | None,
           now: float | None = None, sharing: SharingSettings | None = None, latest: Snapshot | None = None) -> int:
    """`sharing`: this machine's place, for its reservations and the use of cards others hold
    without a claim, in `latest` (none with `statuses`: hosts')."""
    place = sharing or SharingSettings()
    shares = per_card(place.directory, latest, place.idle_release_s) if statuses is None else {}
    unclaimed = uses_without_claim(latest, shares) if latest is not None else []
    if args.json:
        doc = users_document(holders, now if now is not None else time.time(), watched, statuses)
        if statuses is None:  # this machine's reservations (gpumon/sharing)
            doc["reservations"] = [c.reservation.to_dict() for c in shares.values() if c.reservation is not None]
            doc["without_claim"] = [{**u.to_dict(), "words": u.words()} for u in unclaimed]
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return EXIT_OK
    out = users_text(list(holders), show_hosts=statuses is not None)
    if statuses is None:
        out += "".join(line + "\n" for line in reservations_text(
            {ref: c.reservation for ref, c in shares.items() if c.reservation is not None}))
        out += "".join(f"Without a claim: {u.words()}\n" for u in unclaimed)
    for status in statuses or ():
        entry = status.to_dict()
        if entry["state"] not in ("ok", "stale"):
            out += printable(f"{status.host}: {entry['state']}: {entry['error'] or '?'} (not read)") + "\n"
    sys.stdout.write(out + _watched_line(watched))
    return EXIT_OK


def _watched_line(watched: float) -> str:
    span = format_duration(watched) if watched >= 60 else f"{watched:.1f}s"
    return f"Watched for {span}: idle time counts from the first sample (a longer --window sees longer idleness).\n"
