"""`gpumon health [--json] [--hosts …]`: is any card going bad? One line per card, or JSON.

Exit status: 0 every card ok, 1 some card warns, 2 some card fails. A usage error is status 2 too:
it is told apart by its one line on stderr and nothing on stdout (a verdict always prints its
cards). So it works as Slurm's HealthCheckProgram or a node-problem-detector plugin (docs/health.md).

One run sees what the cards say now. What climbs (PCIe replays, correctable row remaps, NVLink
errors) is measured against the previous run on this host, remembered in the state directory
(health-baseline.HOST.json), so a check every few minutes sees a counter climbing between runs.
XIDs are events, and they may have come before this run: where a `gpumon watch` runs on the host,
the run takes the XIDs it heard (its state file, health/seen_xids.py); where none runs, the kernel
log's `NVRM: Xid` lines (`--kernel-log`, /dev/kmsg, else the journal). Either way they count as they
would have had the run been watching: by the XID policy, within its windows.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any

import platformdirs

from gpumon.cards.sampler import sample_once
from gpumon.cli.common import fleet_requested, load_settings, open_source, xid_state_file
from gpumon.config import Config
from gpumon.counters import Health
from gpumon.errors import UsageError
from gpumon.health.seen_xids import Seen, pci_key, read_kernel_log, read_watch_state
from gpumon.health.verdicts import card_verdict, fleet_health_document, health_document
from gpumon.model import GpuSample, HostStatus
from gpumon.sanitize import printable

log = logging.getLogger(__name__)
EXIT = {"ok": 0, "warn": 1, "fail": 2}


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):
        return _hosts(args)
    settings = load_settings(args)
    config = settings.config
    if args.kernel_log is not None:
        _check_kernel_log(args.kernel_log)
    kernel_log = args.kernel_log or "/dev/kmsg"
    deadline = time.monotonic() + args.timeout
    backend = open_source(args, settings.health, timeout=args.timeout)
    tracker = backend.health_baseline()
    baseline = _baseline_file() if tracker is not None else None
    seen = None
    try:
        if baseline is not None:
            _load(tracker, baseline)
            seen = _xids_before(backend, tracker, config, kernel_log, deadline)
        snapshot = sample_once(backend, max(0.0, deadline - time.monotonic()), settings.host_paths)
        if baseline is not None:
            _save(tracker, baseline)
    finally:
        backend.close()
    doc = health_document(snapshot)
    if seen is not None:
        doc["xids_before"] = seen.to_dict()
    if args.json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("".join(_line(str(g.index), g, card_verdict(g)) for g in snapshot.gpus))
    return EXIT[doc["verdict"]]


def _check_kernel_log(path: str) -> None:
    """A log the user named must be readable: read later, a missing one would only be a note in
    --json's xids_before, and the verdict would go on as if the log had no XIDs."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise UsageError(f"--kernel-log {path}: {exc.strerror or exc}") from None
    try:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise UsageError(f"--kernel-log {path}: is a directory (give a file of /dev/kmsg records)")
    finally:
        os.close(fd)


def _line(card: str, gpu: GpuSample, verdict: Health) -> str:
    word = verdict.verdict if verdict.verdict == "ok" else verdict.verdict.upper()
    head = f"GPU {card}  {word:<4}  {gpu.name}  {gpu.uuid or '-'}"
    why = "; ".join(f"{r.code}: {r.text} -> {r.action}" for r in verdict.reasons)
    return printable(f"{head}  {why}" if why else head) + "\n"


def _hosts(args: argparse.Namespace) -> int:
    """Each host's cards as it answers (a slow host holds up no other); --json, one document."""
    from gpumon.cli import fleet

    settings = load_settings(args)
    hosts = fleet.host_list(args, settings.config)
    if args.json:
        report = fleet_health_document(fleet.collect(args, settings, hosts))
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
    else:
        def show(status: HostStatus) -> None:
            sys.stdout.write(_host_lines(status))
            sys.stdout.flush()

        report = fleet_health_document(fleet.collect(args, settings, hosts, on_answer=show))
    return EXIT[report["verdict"]]


def _host_lines(status: HostStatus) -> str:
    """One host's cards; a host that could not be asked is one FAIL line: it cannot vouch for them."""
    entry = status.to_dict()
    if status.snapshot is None or entry["state"] not in ("ok", "stale"):
        return printable(f"HOST {status.host}  FAIL  {entry['state']}: {entry['error'] or '?'}") + "\n"
    return "".join(_line(f"{status.host}:{g.index}", g, card_verdict(g)) for g in status.snapshot.gpus)


# -- the XIDs that came before this run --

def _xids_before(backend: Any, tracker: Any, config: Config, kernel_log: str, deadline: float) -> Seen:
    """Noted in the tracker by card, as if this run had heard them: watch's, else the kernel log's."""
    settings = tracker.settings  # the config's [health]: its window and XID policy
    now = time.time()
    span = max([settings.window_s, *(t.within_s for t in settings.xid.thresholds)])
    seen = read_watch_state(xid_state_file(config))
    if seen is None:
        seen = read_kernel_log(kernel_log, now - span)
    elif seen.since > now - span:  # a watch started within the window: the kernel log has what came before
        earlier = read_kernel_log(kernel_log, now - span)
        seen = Seen(seen.source, f"{seen.detail}; before it started: {earlier.detail}",
                    seen.xids + tuple(x for x in earlier.xids if x.when < seen.since), seen.since)
    if not seen.xids:
        return seen
    cards = backend.identity(max(0.0, deadline - time.monotonic())).gpus
    by_uuid = {g.uuid: g for g in cards if g.uuid}
    by_pci = {pci_key(g.pci_bus_id): g for g in cards if g.pci_bus_id}
    for xid in seen.xids:
        gpu = by_uuid.get(xid.uuid) if xid.uuid else by_pci.get(xid.pci)
        if gpu is not None and now - xid.when < span:
            tracker.note_xid(gpu.uuid or f"index:{gpu.index}", xid.code, xid.when)
    return seen


# -- what the previous run saw --

def _baseline_file() -> Path:
    return Path(platformdirs.user_state_dir("gpumon")) / f"health-baseline.{socket.gethostname()}.json"


def _load(tracker: Any, path: Path) -> None:
    try:
        saved = json.loads(path.read_text())
        if isinstance(saved, dict):
            tracker.import_readings({k: v for k, v in saved.items() if isinstance(v, list)}, time.time())
    except FileNotFoundError:
        pass
    except (OSError, ValueError, TypeError) as exc:  # a damaged file: start again from this run
        log.info("health baseline %s unusable (%s): starting again", path, exc)


def _save(tracker: Any, path: Path) -> None:
    """Written atomically; a state directory that cannot be written (a read-only container) only
    means the next run has nothing to compare with."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(tracker.export_readings()))
        os.replace(tmp, path)
    except OSError as exc:
        log.info("cannot keep the health baseline %s: %s", path, exc)
