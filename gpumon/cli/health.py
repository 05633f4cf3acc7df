"""`gpumon health [--json] [--hosts …]`: is any card going bad? One line per card, or JSON.

Exit status: 0 every card ok, 1 some card warns, 2 some card fails. A usage error is status 2 too:
it is told apart by its one line on stderr and nothing on stdout (a verdict always prints its
cards). So it works as Slurm's HealthCheckProgram or a node-problem-detector plugin (README).

One run sees what the cards say now. What climbs (PCIe replays, correctable row remaps, NVLink
errors) is measured against the previous run on this host, remembered in the state directory
(health-baseline.HOST.json), so a check every few minutes sees a counter climbing between runs.
XIDs are events: a run sees their lasting marks (a lost card, pending remaps, uncorrectable ECC);
`watch --alert health` and the TUI, which keep running, also see the XIDs themselves.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

import platformdirs

from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.counters import Health, HealthReason
from gpumon.model import FleetSnapshot, GpuSample, Snapshot
from gpumon.monitor.health import worst
from gpumon.monitor.sampler import sample_once
from gpumon.sanitize import printable

log = logging.getLogger(__name__)
EXIT = {"ok": 0, "warn": 1, "fail": 2}
_NOT_RESPONDING = "reset the card if it stays silent (nvidia-smi -r), or reboot"


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):
        return _hosts(args)
    load_settings(args)
    deadline = time.monotonic() + args.timeout
    backend = open_source(args, timeout=args.timeout)
    tracker = getattr(backend, "health", None)
    baseline = _baseline_file() if tracker is not None and getattr(backend, "name", "") == "nvml" else None
    try:
        if baseline is not None:
            _load(tracker, baseline)
        snapshot = sample_once(backend, wait_s=max(0.0, deadline - time.monotonic()))
        if baseline is not None:
            _save(tracker, baseline)
    finally:
        backend.close()
    cards = [card_verdict(g) for g in snapshot.gpus]
    verdict = worst(h.verdict for h in cards)
    if args.json:
        doc = {"schema": 1, "time": snapshot.time, "host": snapshot.host, "verdict": verdict,
               "gpus": _cards_json(snapshot, cards)}
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("".join(_line(str(g.index), g, h) for g, h in zip(snapshot.gpus, cards, strict=True)))
    return EXIT[verdict]


def card_verdict(gpu: GpuSample) -> Health:
    """The card's verdict, counting what its state says: a card whose calls hang warns (it may
    come back), one that is lost fails, and one never judged (no counters from its source) is ok."""
    verdict = gpu.health
    if gpu.state == "lost" and (verdict is None or verdict.verdict != "fail"):
        return Health("fail", (HealthReason("lost", f"the card is lost ({gpu.error or 'GPU is lost'})",
                                            "reset the card (nvidia-smi -r) or reboot"),))
    if gpu.state == "stale":
        reason = HealthReason("not_responding", f"not responding for {gpu.stale_s or 0:.0f} s", _NOT_RESPONDING)
        reasons = (*(verdict.reasons if verdict else ()), reason)
        return Health(worst(("warn", verdict.verdict if verdict else None)), reasons)
    return verdict or Health("ok")


def _cards_json(snapshot: Snapshot, cards: list[Health]) -> list[dict[str, Any]]:
    out = []
    for raw, verdict in zip(snapshot.to_dict()["gpus"], cards, strict=True):
        raw.pop("processes", None)
        raw["health"] = verdict.to_dict()
        out.append(raw)
    return out


def _line(card: str, gpu: GpuSample, verdict: Health) -> str:
    word = verdict.verdict if verdict.verdict == "ok" else verdict.verdict.upper()
    head = f"GPU {card}  {word:<4}  {gpu.name}  {gpu.uuid or '-'}"
    why = "; ".join(f"{r.code}: {r.text} -> {r.action}" for r in verdict.reasons)
    return printable(f"{head}  {why}" if why else head) + "\n"


def _hosts(args: argparse.Namespace) -> int:
    from gpumon.cli import fleet

    config = load_settings(args)
    doc: FleetSnapshot = fleet.collect(args, config, fleet.host_list(args, config))
    verdicts: list[str] = []
    hosts_json, lines = [], []
    for status in doc.hosts:
        entry = status.to_dict()
        snapshot = status.snapshot if entry.pop("snapshot") is not None else None
        if snapshot is None:  # a host that cannot be asked cannot vouch for its cards
            verdicts.append("fail")
            entry.update(verdict="fail", gpus=[])
            lines.append(printable(f"HOST {status.host}  FAIL  {entry['state']}: {entry['error'] or '?'}") + "\n")
        else:
            cards = [card_verdict(g) for g in snapshot.gpus]
            host_verdict = worst(h.verdict for h in cards)
            verdicts.append(host_verdict)
            entry.update(verdict=host_verdict, gpus=_cards_json(snapshot, cards))
            lines += [_line(f"{status.host}:{g.index}", g, h) for g, h in zip(snapshot.gpus, cards, strict=True)]
        hosts_json.append(entry)
    verdict = worst(verdicts)
    if args.json:
        json.dump({"schema": 1, "time": doc.time, "verdict": verdict, "hosts": hosts_json}, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write("".join(lines))
    return EXIT[verdict]


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
