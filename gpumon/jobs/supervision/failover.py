"""When a job's card has failed, in words: what makes the supervisor move a `--failover` job.

A card has failed (for a job's purposes) when it is lost (fell off the bus: NVML answers
GPU_IS_LOST), when it reports an XID the XID policy fails a card for (health/xid.py: FATAL_XIDS
and the site's `[health.xid]`, fatal codes and thresholds that fail; the health verdict reads the
same policy), or when its NVSwitch fabric registration failed. A card that
is merely busy, slow ("not responding") or whose driver is being reloaded has not failed: a job
on it is left alone. A job that exits with an error on a healthy card is not moved either: that
is the program's fault, not the card's.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpumon.config import Config, load_config
from gpumon.errors import GpumonError
from gpumon.health.rules import HealthSettings, parse_settings
from gpumon.health.xid import XidPolicy, words
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


@dataclass
class XidsSeen:
    """Each card's recent XIDs that the policy counts, for its thresholds ("43 three times in 10 minutes")."""

    cards: dict[int, list[tuple[int, float]]] = field(default_factory=dict)

    def add(self, index: int, code: int, when: float, policy: XidPolicy) -> tuple[tuple[int, float], ...]:
        if policy.noted(code):
            self.cards[index] = [(code, when), *self.cards.get(index, ())][:policy.keep()]
        return tuple(self.cards.get(index, ()))


def xid_trouble(snapshot: Snapshot | None, index: int, code: int, settings: HealthSettings,
                when: float | None = None, seen: XidsSeen | None = None) -> Trouble | None:
    """Card `index` failed by the XID policy of `settings` after this XID (a fatal code, or a
    threshold that fails reached), or None for XIDs that do not mean the card failed (13, 31, 43
    by default: the program's own faults)."""
    when = time.time() if when is None else when
    recent = seen.add(index, code, when, settings.xid) if seen is not None else ((code, when),)
    found = next((f for f in settings.xid.judge(recent, when, settings.window_s)
                  if f.verdict == "fail" and f.code == code), None)
    if found is None:
        return None
    gpu = next((g for g in snapshot.gpus if g.index == index), None) if snapshot is not None else None
    repeated = f" ({found.count} times within {found.within_s / 60:g} min)" if found.within_s else ""
    return Trouble(index, gpu.uuid if gpu is not None else None,
                   f"XID {found.code} on GPU {index}: {words(found.code)}{repeated}")


def job_config(path: str | None = None) -> Config:
    """The config `gpumon run` checked (`path`, its --config; else $GPUMON_CONFIG or the default):
    its [health.xid], so failover fails a card for the XIDs the health verdict fails it for, and
    the host's [claims]. A file that no longer reads gives the defaults, said once."""
    try:
        return load_config(path)
    except GpumonError as exc:
        print(f"gpumon: {exc}; failover uses the default XID policy", file=sys.stderr)
        return Config()


def job_health(config: Config, interval: float) -> HealthSettings:
    """A supervisor's health settings: the config's [health.xid], and the energy counter (read with
    the health counters) at every sample, not every 30 s: the job's energy is the counter's change
    from its start to its end."""
    xid = config.health.get("xid")
    return parse_settings({"interval": f"{interval:g}s", **({"xid": xid} if xid else {})})
