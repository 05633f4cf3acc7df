"""A card's verdict as people are told it, and the documents of `gpumon health --json`.

The health rules judge a card's counters (health/rules.py); a card's state counts too: one whose
calls hang warns (it may come back), one that is lost fails, one never judged is ok. `gpumon
health` and `gpumon serve` (its page and /api/health) tell the same verdicts from here.
"""

from __future__ import annotations

from typing import Any

from gpumon.counters import Health, HealthReason
from gpumon.health.rules import worst
from gpumon.model import FleetSnapshot, GpuSample, Snapshot

_NOT_RESPONDING = "reset the card if it stays silent (nvidia-smi -r), or reboot"


def card_verdict(gpu: GpuSample) -> Health:
    """The card's verdict, counting what its state says."""
    verdict = gpu.health
    if gpu.state == "lost" and (verdict is None or verdict.verdict != "fail"):
        return Health("fail", (HealthReason("lost", f"the card is lost ({gpu.error or 'GPU is lost'})",
                                            "reset the card (nvidia-smi -r) or reboot"),))
    if gpu.state == "stale":
        reason = HealthReason("not_responding", f"not responding for {gpu.stale_s or 0:.0f} s", _NOT_RESPONDING)
        reasons = (*(verdict.reasons if verdict else ()), reason)
        return Health(worst(("warn", verdict.verdict if verdict else None)), reasons)
    return verdict or Health("ok")


def cards_json(snapshot: Snapshot, cards: list[Health]) -> list[dict[str, Any]]:
    """Each card's document without its processes, with its verdict as `health`."""
    out = []
    for raw, verdict in zip(snapshot.to_dict()["gpus"], cards, strict=True):
        raw.pop("processes", None)
        raw["health"] = verdict.to_dict()
        out.append(raw)
    return out


def health_document(snapshot: Snapshot) -> dict[str, Any]:
    """`gpumon health --json` of one machine."""
    cards = [card_verdict(g) for g in snapshot.gpus]
    return {"schema": 1, "time": snapshot.time, "host": snapshot.host, "verdict": worst(h.verdict for h in cards),
            "gpus": cards_json(snapshot, cards)}


def fleet_health_document(doc: FleetSnapshot) -> dict[str, Any]:
    """`gpumon health --hosts … --json`: a host that cannot be asked cannot vouch for its cards (fail)."""
    hosts = []
    for status in doc.hosts:
        entry = status.to_dict()
        snapshot = status.snapshot if entry.pop("snapshot") is not None else None
        if snapshot is None:
            entry.update(verdict="fail", gpus=[])
        else:
            cards = [card_verdict(g) for g in snapshot.gpus]
            entry.update(verdict=worst(h.verdict for h in cards), gpus=cards_json(snapshot, cards))
        hosts.append(entry)
    return {"schema": 1, "time": doc.time, "verdict": worst(h["verdict"] for h in hosts), "hosts": hosts}
