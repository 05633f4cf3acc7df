"""Every kind of alert rule, registered once (a `RuleKind` each: its words, condition, reading,
evaluation and PromQL), and `parse_rule`, which finds a rule's kind by its first word.

A new kind is a `RuleKind` in a module of its own concern (card_kinds, xid_rules, holder_rules, sharing_rules)
and one entry in KINDS; the grammar (alerting/grammar.py), the engine (alerting/rules.py) and the
PromQL export (alerting/prometheus_rules.py) take it from there.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpumon.alerting.card_kinds import FABRIC, FLAG_KIND, HEALTH_KIND, LOST, METRIC_KIND, THROTTLE, UNREACHABLE
from gpumon.alerting.grammar import Rule, RuleError, RuleKind, Words, parse_tail
from gpumon.alerting.holder_rules import IDLE
from gpumon.alerting.sharing_rules import UNCLAIMED
from gpumon.alerting.xid_rules import XID_KIND

# In this order in the "known:" list of an unknown metric's message.
KINDS: tuple[RuleKind, ...] = (METRIC_KIND, LOST, XID_KIND, THROTTLE, FABRIC, HEALTH_KIND, FLAG_KIND, UNREACHABLE,
                               IDLE, UNCLAIMED)
BY_WORD: dict[str, RuleKind] = {word: kind for kind in KINDS for word in kind.words}


def parse_rule(text: str) -> Rule:
    words = Words(text)
    first = words.take()
    if first is None:
        raise RuleError("alert rule is empty: expected e.g. 'temp > 85 for 30s'")
    metric = first[0].lower()
    kind = BY_WORD.get(metric)
    if kind is None:
        raise words.error(first, f"unknown metric {first[0]!r} (known: {', '.join(BY_WORD)})")
    if kind.whole is not None:
        return kind.whole(text, words.tokens)
    fields = {"text": text, "metric": metric, "kind": kind}
    if kind.condition is not None:
        fields.update(kind.condition(text, words))
    parse_tail(words, kind, metric, fields)
    return Rule(**fields)


def parse_rules(texts: Iterable[str]) -> list[Rule]:
    return [parse_rule(text) for text in texts]
