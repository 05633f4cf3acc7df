"""gpumon's alert rules as a Prometheus alerting-rules file (`gpumon alerts export
--prometheus-rules`), written over the series the exporter serves (exporter/), so that an alert
from Prometheus means what gpumon's own does.
"""

from __future__ import annotations

import json

from gpumon.alerting.rules import Rule
from gpumon.exporter.collector import THROTTLE_BITS
from gpumon.exporter.health import HEALTH
from gpumon.exporter.owners import OWNER_LABELS

# gpumon's mem is used / total. dcgm-exporter has no total: it is used + free + reserved (FB_RESERVED,
# which older dcgm-exporters lack: 0 then, by `or` with free * 0 of the same card).
_PROMQL: dict[str, str] = {
    "util": "DCGM_FI_DEV_GPU_UTIL{sel}",
    "mem": "(DCGM_FI_DEV_FB_USED{sel} / (DCGM_FI_DEV_FB_USED{sel} + DCGM_FI_DEV_FB_FREE{sel}"
           " + (DCGM_FI_DEV_FB_RESERVED{sel} or DCGM_FI_DEV_FB_FREE{sel} * 0)) * 100)",
    "mem_used": "(DCGM_FI_DEV_FB_USED{sel} * 1048576)",
    "temp": "DCGM_FI_DEV_GPU_TEMP{sel}",
    "power": "DCGM_FI_DEV_POWER_USAGE{sel}",
    "fan": "DCGM_FI_DEV_FAN_SPEED{sel}",
    "clock_sm": "DCGM_FI_DEV_SM_CLOCK{sel}",
    "procs": "gpumon_gpu_processes{sel}",
    "ecc": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{sel}",
}
XID_CODES = range(1, 1000)


def _xid_expr(rule: Rule) -> str:
    """An XID of a matching code on the card within the quiet period: fires when one is scraped,
    resolves when the newest is older than the quiet period. One alert per card and code."""
    matchers = [] if rule.gpus is None else ['gpu=~"' + "|".join(str(i) for i in sorted(rule.gpus)) + '"']
    if rule.op == "==":
        matchers.append(f'xid="{rule.threshold:g}"')
    elif rule.op == "!=":
        if rule.threshold != 0:  # `xid` alone is "any XID": no matcher
            matchers.append(f'xid!="{rule.threshold:g}"')
    else:
        matchers.append(f'xid=~"{_codes_regex([c for c in XID_CODES if rule.holds(float(c))])}"')
    sel = "{" + ",".join(matchers) + "}" if matchers else ""
    return f"time() - gpumon_xid_last_timestamp_seconds{sel} < {rule.duration:g}"


def _digits(digits: list[int]) -> str:
    if len(digits) == 10:
        return "[0-9]"
    if len(digits) == 1:
        return str(digits[0])
    if digits == list(range(digits[0], digits[-1] + 1)):
        return f"[{digits[0]}-{digits[-1]}]"
    return "[" + "".join(map(str, digits)) + "]"


def _codes_regex(codes: list[int]) -> str:
    """A short regex for a set of XID codes (1..999), decade by decade: `xid > 100` is
    `10[1-9]|1[1-9][0-9]|[2-9][0-9][0-9]`, not 899 alternatives."""
    wanted = set(codes)
    parts: list[str] = []
    decades = {d: [c % 10 for c in range(d * 10, d * 10 + 10) if c in wanted] for d in range(100)}
    full = {d for d, digits in decades.items() if len(digits) == 10}
    done: set[int] = set()
    hundreds = [h for h in range(1, 10) if all(d in full for d in range(h * 10, h * 10 + 10))]
    if hundreds:
        parts.append(_digits(hundreds) + "[0-9][0-9]")
        done |= {d for h in hundreds for d in range(h * 10, h * 10 + 10)}
    for h in range(10):  # whole decades of one hundred: `1[1-9][0-9]`
        tens = [d % 10 for d in range(h * 10, h * 10 + 10) if d in full and d not in done and d]
        if tens:
            parts.append((str(h) if h else "") + _digits(tens) + "[0-9]")
            done |= {h * 10 + t for t in tens}
    for d, digits in decades.items():
        if digits and d not in done:
            parts.append((str(d) if d else "") + _digits(digits))
    return "|".join(parts) or "0"  # XID codes start at 1: "0" matches none


def rule_expr(rule: Rule) -> str:
    """The rule in PromQL, per card: who holds the card (the owner labels) is left out, so an alert
    is the card's, as gpumon's own are, and goes on firing when the job on the card changes (a job
    that a fatal XID or a lost card ends would otherwise resolve its alert and start another)."""
    return f"max without ({', '.join(OWNER_LABELS)}) ({_card_expr(rule)})"


def _card_expr(rule: Rule) -> str:
    sel = "" if rule.gpus is None else '{gpu=~"' + "|".join(str(i) for i in sorted(rule.gpus)) + '"}'
    if rule.metric == "xid":
        return _xid_expr(rule)
    if (health := health_rule_expr(rule, sel)) is not None:
        return health
    if rule.metric == "lost":
        return f"gpumon_gpu_lost{sel} == 1"
    if rule.metric == "fabric":  # exported only for cards on an NVSwitch fabric
        return f"DCGM_FI_DEV_FABRIC_MANAGER_STATUS{sel} != 3"
    if rule.metric == "throttle":
        bits = sorted(THROTTLE_BITS[r] for r in rule.reasons)
        tests = [f"floor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{sel} / {bit}) % 2 == 1" for bit in bits]
        return " or ".join(f"({t})" for t in tests) if len(tests) > 1 else tests[0]
    if rule.metric == "power" and rule.percent:
        value = f"(DCGM_FI_DEV_POWER_USAGE{sel} / DCGM_FI_DEV_POWER_MGMT_LIMIT{sel} * 100)"
    else:
        value = _PROMQL[rule.metric].format(sel=sel)
    return f"{value} {rule.op} {rule.threshold:g}"


def _alert_name(rule: Rule, index: int) -> str:
    words = "".join(part.capitalize() for part in rule.metric.split("_"))
    return f"Gpumon{words}{index + 1}"


# Rules that no exported series can express.
NOT_IN_PROMQL = {
    "idle": "who holds a card idle is known to gpumon watch alone (it follows each process's SM %)",
    "unreachable": "a host's reachability: alert on up == 0 of its scrape job",
}


def prometheus_rules(rules: list[Rule]) -> str:
    """An alerting-rules file (YAML) for the rules; JSON-quoted strings are valid YAML scalars."""
    lines = ["# Generated by `gpumon alerts export --prometheus-rules`.",
             "# Over dcgm-exporter 3.x metric names, as `gpumon watch --prometheus` exports them.",
             "groups:", "  - name: gpumon", "    rules:"]
    exported = 0
    for i, rule in enumerate(rules):
        if rule.metric in NOT_IN_PROMQL:
            lines.insert(2 + i - exported, f"# Left out: {json.dumps(rule.text)}: {NOT_IN_PROMQL[rule.metric]}")
            continue
        exported += 1
        lines += [
            f"      - alert: {_alert_name(rule, i)}",
            f"        expr: {json.dumps(rule_expr(rule))}",
        ]
        if rule.duration and rule.metric != "xid":  # an xid rule's duration is its quiet period, in expr
            lines.append(f"        for: {_duration(rule.duration)}")
        if rule.clear is not None:
            lines.append("        # gpumon's 'clear' hysteresis has no PromQL equivalent; rule kept without it")
        lines += [
            "        labels:",
            "          severity: warning",
            "        annotations:",
            f"          summary: {json.dumps(_summary(rule))}",
            f"          rule: {json.dumps(rule.text)}",
        ]
    if not exported:
        lines[-1] = "    rules: []"
    return "\n".join(lines) + "\n"


def _summary(rule: Rule) -> str:
    where = " on GPU {{ $labels.gpu }} ({{ $labels.modelName }})"
    what = ": XID {{ $labels.xid }}" if rule.metric == "xid" else (
        ": {{ $labels.reason }}" if rule.metric == "health" else "")
    return f"gpumon rule {rule.text!r}{where}{what}"


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    if seconds >= 1 and seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{int(seconds * 1000)}ms"



_HEALTH_PROMQL = {
    "mem_temp": "DCGM_FI_DEV_MEMORY_TEMP{sel}",
    "pcie_replay_rate": "rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{sel}[5m])",  # per second, as the rule keeps it
    "correctable_remaps": "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{sel}",
}


def health_rule_expr(rule: Rule, sel: str) -> str | None:
    """The expression of a health rule (None: not one)."""
    if rule.metric == "health":
        return f"{HEALTH}{sel} >= {rule.threshold:g}"
    if rule.metric == "remap_pending":
        return f"DCGM_FI_DEV_ROW_REMAP_PENDING{sel} == 1"
    if rule.metric == "remap_failure":
        return f"DCGM_FI_DEV_ROW_REMAP_FAILURE{sel} == 1"
    if rule.metric in _HEALTH_PROMQL:
        return f"{_HEALTH_PROMQL[rule.metric].format(sel=sel)} {rule.op} {rule.threshold:g}"
    return None
