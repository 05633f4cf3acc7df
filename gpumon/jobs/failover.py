"""When a job's card has failed, in words: what makes the supervisor move a `--failover` job.

A card has failed (for a job's purposes) when it is lost (fell off the bus: NVML answers
GPU_IS_LOST), when it reports one of the FATAL_XIDS (NVIDIA's catalogue, in health/xid.py: the
health verdict uses the same list), or when its NVSwitch fabric registration failed. A card that
is merely busy, slow ("not responding") or whose driver is being reloaded has not failed: a job
on it is left alone. A job that exits with an error on a healthy card is not moved either: that
is the program's fault, not the card's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpumon.health.xid import FATAL_XIDS
from gpumon.model import GpuSample, Snapshot


@dataclass(frozen=True)
class Trouble:
    """A card of the job failed: which card (whole card, by UUID: never chosen again) and why."""

    index: int
    uuid: str | None
    reason: str


def card_trouble(snapshot: Snapshot, cards: Iterable[int]) -> Trouble | None:
    """The first of the job's cards (NVML indices; a MIG slice's card) that has failed, or None."""
    wanted = set(cards)
    for gpu in snapshot.gpus:
        if gpu.index in wanted and (why := _failed(gpu)):
            return Trouble(gpu.index, gpu.uuid, why)
    return None


def _failed(gpu: GpuSample) -> str | None:
    if gpu.state == "lost":
        said = gpu.error if gpu.error and gpu.error.lower() not in ("lost", "gpu is lost") else None
        return f"GPU {gpu.index} is lost" + (f" ({said})" if said else "")
    if gpu.state == "ok" and gpu.fabric == "failed":
        return f"GPU {gpu.index}: its NVSwitch fabric registration failed"
    return None


def xid_trouble(snapshot: Snapshot | None, index: int, code: int) -> Trouble | None:
    """A fatal XID on card `index`, or None for XIDs that do not mean the card failed (13, 31, 43:
    the program's own faults)."""
    if code not in FATAL_XIDS:
        return None
    gpu = next((g for g in snapshot.gpus if g.index == index), None) if snapshot is not None else None
    return Trouble(index, gpu.uuid if gpu is not None else None, f"XID {code} on GPU {index}: {FATAL_XIDS[code]}")
