"""The kinds of rule about one card: a reading compared with a value (`temp > 85`), a yes-or-no
counter (`remap_pending`), `lost`, `health`, `throttle REASON`, `fabric`; and `unreachable`
(a fleet host's, evaluated per host). Each is one `RuleKind`: its words, its condition, how it reads
a card, its PromQL over the exporter's series. XID rules are alerting/xid_rules.py's, holder rules
alerting/holder_rules.py's; alerting/kinds.py lists them all.

A card that does not answer (lost or stale) says nothing new: its readings are None, but for
`lost` itself and `health` (a lost card's verdict is news: it fails).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpumon.alerting.grammar import HOST, OPS, Rule, RuleKind, Token, Words
from gpumon.errors import UsageError
from gpumon.exporter.fields import THROTTLE_BITS
from gpumon.exporter.health import HEALTH
from gpumon.model import THROTTLE_REASONS, GpuSample
from gpumon.units import parse_size

THROTTLE_GROUPS = {"thermal": {"sw_thermal", "hw_thermal"}, "power": {"sw_power_cap", "hw_power_brake"}}
THROTTLE_NAMES = set(THROTTLE_REASONS.values())
PER_SECOND = {"/s": 1.0, "/min": 60.0, "/h": 3600.0}
VERDICT_LEVEL = {"ok": 0.0, "warn": 1.0, "fail": 2.0}
FABRIC_NOT_READY = {"not_started", "in_progress", "failed"}
NUMBER, PERCENT, SIZE, RATE = "number", "percent", "size", "rate"


@dataclass(frozen=True)
class Metric:
    """A reading a rule compares with a value: how it is read from a card (None: the card does not
    say), what its VALUE may be, and the same reading in PromQL (`{sel}`: the card selector)."""

    read: Callable[[GpuSample], float | None]
    promql: str
    takes: str = NUMBER  # NUMBER, PERCENT (a number or N%), SIZE (8G), RATE (10/min, kept per second)


def _counter(name: str) -> Callable[[GpuSample], float | None]:
    return lambda g: getattr(g.counters, name) if g.counters else None


# gpumon's mem is used / total. dcgm-exporter has no total: it is used + free + reserved
# (FB_RESERVED, which older dcgm-exporters lack: 0 then, by `or` with free * 0 of the same card).
METRICS: dict[str, Metric] = {
    "util": Metric(lambda g: g.utilization_gpu, "DCGM_FI_DEV_GPU_UTIL{sel}", PERCENT),
    "mem": Metric(lambda g: g.memory_percent,
                  "(DCGM_FI_DEV_FB_USED{sel} / (DCGM_FI_DEV_FB_USED{sel} + DCGM_FI_DEV_FB_FREE{sel}"
                  " + (DCGM_FI_DEV_FB_RESERVED{sel} or DCGM_FI_DEV_FB_FREE{sel} * 0)) * 100)", PERCENT),
    "mem_used": Metric(lambda g: g.memory_used, "(DCGM_FI_DEV_FB_USED{sel} * 1048576)", SIZE),
    "temp": Metric(lambda g: g.temperature, "DCGM_FI_DEV_GPU_TEMP{sel}"),
    "power": Metric(lambda g: g.power_draw, "DCGM_FI_DEV_POWER_USAGE{sel}", PERCENT),
    "fan": Metric(lambda g: g.fan, "DCGM_FI_DEV_FAN_SPEED{sel}", PERCENT),
    "clock_sm": Metric(lambda g: g.clock_sm, "DCGM_FI_DEV_SM_CLOCK{sel}"),
    "procs": Metric(lambda g: len(g.processes) if g.state == "ok" else None, "gpumon_gpu_processes{sel}"),
    "ecc": Metric(lambda g: g.ecc_errors_uncorrected, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{sel}"),
    # Card health counters (gpumon/counters.py).
    "mem_temp": Metric(_counter("memory_temperature"), "DCGM_FI_DEV_MEMORY_TEMP{sel}"),
    "pcie_replay_rate": Metric(_counter("pcie_replay_rate"), "rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{sel}[5m])", RATE),
    "correctable_remaps": Metric(_counter("remapped_rows_correctable"), "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{sel}"),
}
# Yes-or-no health counters, written alone like `lost`: (how a card says it, its series).
FLAGS: dict[str, tuple[Callable[[GpuSample], bool | None], str]] = {
    "remap_pending": (_counter("remapped_rows_pending"), "DCGM_FI_DEV_ROW_REMAP_PENDING"),
    "remap_failure": (_counter("remapped_rows_failure"), "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
}


def _answers(read: Callable[[Rule, GpuSample], float | None]) -> Callable[[Rule, GpuSample], float | None]:
    """`read`, for a card that answers; None for one lost or stale."""
    return lambda rule, g: None if g.state in ("lost", "stale") else read(rule, g)


def _is(flag: bool | None) -> float | None:
    return None if flag is None else float(flag)


# --- a reading compared with a value -------------------------------------------------------------

def compared(metric: str, tok: Token, words: Words) -> float:
    """A rule's VALUE (or its clear VALUE) for `metric`, in the unit the metric is read in."""
    return _compared(metric, tok, words)[0]


def _compared(metric: str, tok: Token, words: Words) -> tuple[float, bool]:
    """(value, whether it is a percentage of the power limit)."""
    raw, takes = tok[0], METRICS[metric].takes if metric in METRICS else NUMBER
    if takes == RATE:
        unit = next((u for u in PER_SECOND if raw.lower().endswith(u)), None)
        try:
            if unit is None:
                raise ValueError
            return float(raw[: -len(unit)]) / PER_SECOND[unit], False
        except ValueError:
            raise words.error(tok, f"bad value {raw!r} for {metric}: expected a rate like 10/min "
                                   "(per /s, /min or /h)") from None
    try:
        if takes == SIZE:
            return float(parse_size(raw)), False
        if raw.endswith("%"):
            if takes != PERCENT:
                raise ValueError
            return float(raw[:-1]), metric == "power"
        return float(raw), False
    except (ValueError, UsageError):
        hint = ("a size like 8G" if takes == SIZE else "a number" + (" or a percentage" if metric == "power" else ""))
        raise words.error(tok, f"bad value {raw!r} for {metric}: expected {hint}") from None


def comparison(text: str, words: Words) -> dict[str, Any]:
    """`OP VALUE` after the metric's word."""
    word = words.tokens[words.pos - 1]
    op = words.take()
    if op is None or op[0] not in OPS:
        raise words.error(op, f"expected a comparison ({' '.join(OPS)}) after {word[0]!r}")
    value = words.take()
    if value is None:
        raise words.error(None, "expected a value to compare with")
    threshold, percent = _compared(word[0].lower(), value, words)
    return {"op": op[0], "threshold": threshold, "percent": percent}


def _metric_value(rule: Rule, g: GpuSample) -> float | None:
    if rule.metric == "power" and rule.percent:
        return g.power_percent
    return METRICS[rule.metric].read(g)


def _metric_promql(rule: Rule, sel: str) -> str:
    if rule.metric == "power" and rule.percent:
        value = f"(DCGM_FI_DEV_POWER_USAGE{sel} / DCGM_FI_DEV_POWER_MGMT_LIMIT{sel} * 100)"
    else:
        value = METRICS[rule.metric].promql.format(sel=sel)
    return f"{value} {rule.op} {rule.threshold:g}"


# --- conditions of the kinds written alone ------------------------------------------------------

def alone(text: str, words: Words) -> dict[str, Any]:
    """`lost`, `fabric`, `remap_pending`, …: true or not."""
    return {"op": "==", "threshold": 1.0}


def _health_level(text: str, words: Words) -> dict[str, Any]:
    """`health` (warn or worse) or `health fail`."""
    level = "warn" if words.ends_condition() else words.take()[0]  # type: ignore[index]
    if level.lower() not in ("warn", "fail"):
        raise words.error(words.tokens[words.pos - 1], f"health takes warn or fail, not {level!r}")
    return {"op": ">=", "threshold": VERDICT_LEVEL[level.lower()]}


def _throttle_reason(text: str, words: Words) -> dict[str, Any]:
    reason = words.take()
    if reason is None:
        raise words.error(None, "throttle needs a reason: thermal, power, hw_slowdown, …")
    name = reason[0].lower()
    reasons = THROTTLE_GROUPS.get(name, {name} if name in THROTTLE_NAMES else None)
    if reasons is None:
        known = ", ".join(sorted(THROTTLE_GROUPS) + sorted(THROTTLE_NAMES))
        raise words.error(reason, f"unknown throttle reason {reason[0]!r} (known: {known})")
    return {"op": "==", "threshold": 1.0, "reasons": frozenset(reasons)}


def _throttled(rule: Rule, g: GpuSample) -> float | None:
    if g.throttle_reasons is None:
        return None
    return 1.0 if rule.reasons & set(g.throttle_reasons) else 0.0


def _throttle_promql(rule: Rule, sel: str) -> str:
    bits = sorted(THROTTLE_BITS[r] for r in rule.reasons)
    tests = [f"floor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{sel} / {bit}) % 2 == 1" for bit in bits]
    return " or ".join(f"({t})" for t in tests) if len(tests) > 1 else tests[0]


def _verdict(rule: Rule, g: GpuSample) -> float | None:
    return None if g.health is None or g.state == "stale" else VERDICT_LEVEL[g.health.verdict]


METRIC_KIND = RuleKind(tuple(METRICS), comparison, value=_answers(_metric_value), promql=_metric_promql,
                       clear_value=compared)
LOST = RuleKind(("lost",), alone, value=lambda rule, g: 1.0 if g.state == "lost" else 0.0,
                promql=lambda rule, sel: f"gpumon_gpu_lost{sel} == 1")
THROTTLE = RuleKind(("throttle",), _throttle_reason, value=_answers(_throttled), promql=_throttle_promql)
# Exported only for cards on an NVSwitch fabric.
FABRIC = RuleKind(("fabric",), alone,
                  value=_answers(lambda rule, g: None if g.fabric is None else float(g.fabric in FABRIC_NOT_READY)),
                  promql=lambda rule, sel: f"DCGM_FI_DEV_FABRIC_MANAGER_STATUS{sel} != 3")
HEALTH_KIND = RuleKind(("health",), _health_level, value=_verdict,
                       promql=lambda rule, sel: f"{HEALTH}{sel} >= {rule.threshold:g}",
                       summary=": {{ $labels.reason }}")
FLAG_KIND = RuleKind(tuple(FLAGS), alone, value=_answers(lambda rule, g: _is(FLAGS[rule.metric][0](g))),
                     promql=lambda rule, sel: f"{FLAGS[rule.metric][1]}{sel} == 1")
UNREACHABLE = RuleKind(("unreachable",), alone, scope=HOST,
                       not_in_promql="a host's reachability: alert on up == 0 of its scrape job")
