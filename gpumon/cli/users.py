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
from typing import Any

from gpumon.cards.sampler import Sampler
from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.cli.tables import users_text
from gpumon.errors import EXIT_OK, UsageError
from gpumon.model import HostStatus, Snapshot
from gpumon.owners.holders import Holder, HolderTracker, users_document
from gpumon.sanitize import printable
from gpumon.sharing.view import reservations_now, reservations_text
from gpumon.units import format_duration

DEFAULT_SAMPLES = 3


def run(args: argparse.Namespace) -> int:
    config = load_settings(args)
    if fleet_requested(args):
        from gpumon.cli import fleet

        if getattr(args, "replay", None):
            raise UsageError("--replay reads one machine: not with --hosts")
        runner = fleet.build(args, config, fleet.host_list(args, config))
        window = _window(args, runner.interval)
        holders, statuses, watched = asyncio.run(_watch_fleet(runner, window))
        if problems := runner.problems():  # the Prometheus server could not be read, or knows no GPU
            raise UsageError("; ".join(problems))
        _print(args, holders, watched, statuses)
        return fleet.read_status(statuses)
    window = _window(args, args.interval)
    backend = open_source(args)
    try:
        holders, watched, last = asyncio.run(_watch_host(args, backend, window))
    finally:
        backend.close()
    return _print(args, holders, watched, None, last)


def _window(args: argparse.Namespace, interval: float) -> float:
    return args.window if args.window is not None else (DEFAULT_SAMPLES - 1) * interval


async def _watch_host(args: argparse.Namespace, backend: Any, window: float) -> tuple[tuple[Holder, ...], float, float]:
    """Sample until the samples span `window` (by their own times: a replay goes as fast as it reads)."""
    replaying = getattr(args, "replay", None) is not None
    interval = 0.0 if replaying else args.interval
    sampler = Sampler(backend, interval=interval, enrich=True)  # holders need each process's owner
    tracker = HolderTracker()
    seen: dict[str, Any] = {"holders": (), "first": None, "last": None}

    def on_snapshot(snapshot: Snapshot) -> None:
        if snapshot.stale:
            return
        seen["holders"] = tracker.update(snapshot)
        seen["first"] = seen["first"] if seen["first"] is not None else snapshot.time
        seen["last"] = snapshot.time
        if snapshot.time - seen["first"] >= window - interval / 2:  # sampling times jitter
            sampler.stop()

    sampler.subscribe(on_snapshot)
    await sampler.run(len(backend.snapshots) if replaying else None)
    if seen["last"] is None:
        raise UsageError("no sample to read holders from (an empty recording?)")
    return seen["holders"], seen["last"] - seen["first"], seen["last"]


async def _watch_fleet(runner: Any, window: float) -> tuple[list[Holder], tuple[HostStatus, ...], float]:
    """Every host's holders after each host that answers has been watched for `window`."""
    from gpumon.cli.fleet import settle_timeout

    tracker = HolderTracker()
    held: dict[str, tuple[Holder, ...]] = {}
    span: dict[str, list[float]] = {}  # host -> [first sample's time, last sample's time]

    def on_host(status: HostStatus) -> None:
        if status.state == "live" and status.snapshot is not None:
            held[status.host] = tracker.update(status.snapshot, status.host)
            times = span.setdefault(status.host, [status.snapshot.time, status.snapshot.time])
            times[1] = status.snapshot.time

    def watched() -> float:
        return min((last - first for first, last in span.values()), default=0.0)

    runner.subscribe(on_host)
    task = asyncio.create_task(runner.run())
    try:
        await runner.settle(settle_timeout(runner.interval))
        # Hosts run on their own clocks and intervals: each is watched until its own samples span
        # the window, or gives up a few intervals after it should have.
        deadline = time.monotonic() + window + 3 * runner.interval
        while watched() < window - runner.interval / 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        runner.stop()
        await task
    statuses = runner.statuses()
    answering = {s.host for s in statuses if s.state in ("live", "stale") and s.snapshot is not None}
    return [h for s in statuses if s.host in answering for h in held.get(s.host, ())], statuses, watched()


def _print(args: argparse.Namespace, holders: Any, watched: float, statuses: tuple[HostStatus, ...] | None,
           now: float | None = None) -> int:
    if args.json:
        doc = users_document(holders, now if now is not None else time.time(), watched, statuses)
        if statuses is None:  # this machine's reservations (gpumon/sharing)
            doc["reservations"] = [r.to_dict() for r in reservations_now().values()]
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return EXIT_OK
    out = users_text(list(holders), show_hosts=statuses is not None)
    if statuses is None:
        out += "".join(line + "\n" for line in reservations_text(reservations_now()))
    for status in statuses or ():
        entry = status.to_dict()
        if entry["state"] not in ("ok", "stale"):
            out += printable(f"{status.host}: {entry['state']}: {entry['error'] or '?'} (not read)") + "\n"
    span = format_duration(watched) if watched >= 60 else f"{watched:.1f}s"
    out += (f"Watched for {span}: idle time counts from the first sample "
            "(a longer --window sees longer idleness).\n")
    sys.stdout.write(out)
    return EXIT_OK
