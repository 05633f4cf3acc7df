"""`xid` rules: `xid` (any XID), `xid == 79`, `xid > 100` … An XID is an event, not a level: an
`xid` rule fires once per XID error (its code is the event's value; AlertEngine.xid) and resolves
once no XID has come for its quiet period, the rule's `for` (default 10 minutes).

In PromQL it is written over `gpumon_xid_last_timestamp_seconds{xid="CODE"}` (the newest XID of
each code on each card), so an exported rule means the same: firing when one is scraped, resolved
when the newest is older than the quiet period.
"""

from __future__ import annotations

from typing import Any

from gpumon.alerting.card_kinds import comparison
from gpumon.alerting.grammar import XID, Rule, RuleKind, Words

XID_QUIET_S = 600.0  # an xid rule resolves after this long without an XID, unless `for` says otherwise
XID_CODES = range(1, 1000)


def _condition(text: str, words: Words) -> dict[str, Any]:
    if words.ends_condition():
        return {"op": "!=", "threshold": 0.0}  # any XID
    return comparison(text, words)


def _promql(rule: Rule, sel: str) -> str:
    """One alert per card and code."""
    matchers = [] if rule.gpus is None else ['gpu=~"' + "|".join(str(i) for i in sorted(rule.gpus)) + '"']
    if rule.op == "==":
        matchers.append(f'xid="{rule.threshold:g}"')
    elif rule.op == "!=":
        if rule.threshold != 0:  # `xid` alone is "any XID": no matcher
            matchers.append(f'xid!="{rule.threshold:g}"')
    else:
        matchers.append(f'xid=~"{codes_regex([c for c in XID_CODES if rule.holds(float(c))])}"')
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


def codes_regex(codes: list[int]) -> str:
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


# The rule's duration is its quiet period, written into the expression (no `for:` in the file).
XID_KIND = RuleKind(("xid",), _condition, scope=XID, promql=_promql, default_for=XID_QUIET_S,
                    summary=": XID {{ $labels.xid }}")
