"""The cards' health as a Prometheus server holds it: dcgm-exporter's reliability counters (and
`gpumon_gpu_health` where gpumon exports the card), made into CardCounters and a verdict.

The verdict is drawn here by the same rules as on a host (health/rules.py) from what a scrape
holds: pending or failed row remaps, uncorrectable ECC, retired pages, a lost card. What needs the
host's own history (climbing counters, XIDs) only its gpumon knows: when its `gpumon_gpu_health`
says worse than the counters do, the verdict is its, with a reason saying to ask the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumon.counters import CardCounters, Health, HealthReason
from gpumon.exporter.fields import read_back
from gpumon.exporter.health import HEALTH_FIELDS, VERDICT
from gpumon.health import rules as health

# dcgm-exporter's metric -> (CardCounters field, factor to gpumon's unit, its DCGM blank): the
# exporter's health table read the other way, as dcgm.FIELDS.
COUNTER_FIELDS: dict[str, tuple[str, float, float]] = read_back([*HEALTH_FIELDS, VERDICT])
_FLAGS = ("remapped_rows_failure", "remapped_rows_pending", "retired_pages_pending")
_LEVELS = ("ok", "warn", "fail")


def card_health(values: Mapping[str, float], lost: bool, ecc_uncorrected: int | None,
                settings: health.HealthSettings = health.HealthSettings()) -> tuple[CardCounters | None, Health | None]:
    """A card's counters and verdict (by `settings`' rules) from its readings (named by COUNTER_FIELDS' fields)."""
    found: dict[str, Any] = {}
    for name, _, _ in COUNTER_FIELDS.values():
        value = values.get(name)
        if value is None or name == "gpumon_verdict":
            continue
        found[name] = bool(value) if name in _FLAGS else float(value) if name == "energy_j" else round(value)
    if "energy_j" in found:
        found["energy_source"] = "driver"
    counters = CardCounters(**found) if found else None
    reported = values.get("gpumon_verdict")
    if counters is None and reported is None and not lost:
        return None, None  # nothing to judge by: a source without health counters
    c = counters or CardCounters()
    retired = None if c.retired_pages_sbe is None and c.retired_pages_dbe is None \
        else (c.retired_pages_sbe or 0) + (c.retired_pages_dbe or 0)
    verdict = health.assess(health.HealthValues(
        lost=int(lost), remapped_rows_pending=_flag(c.remapped_rows_pending),
        remapped_rows_failure=_flag(c.remapped_rows_failure), ecc_errors_uncorrected=ecc_uncorrected,
        retired_pages_pending=_flag(c.retired_pages_pending), retired_pages=retired,
        memory_temperature=c.memory_temperature), settings)
    if reported is not None and 0 <= reported < len(_LEVELS) and reported > _LEVELS.index(verdict.verdict):
        said = _LEVELS[int(reported)]
        verdict = Health(said, (*verdict.reasons, HealthReason(
            "reported", f"gpumon on the host says {said}",
            "run `gpumon health` on the host for the reasons and actions")))
    return counters, verdict


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)
