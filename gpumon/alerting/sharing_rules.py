"""Rules about the host's shared cards: `unclaimed [on GPUS]`.

It fires once for each process found on a card another user claims or reserved that is not that
user's (CUDA work started outside gpumon: sharing/view.UseWithoutClaim), and resolves when the
process leaves the card or the claim or reservation ends. The event names the process, its user,
and whose claim or reservation it is on (`process`), never more: gpumon says what happened, it does
not stop anything. `for` and `clear` do not apply.

Which processes are on others' cards is read from the host's shared place, which the engine is
handed as a function of the snapshot (`without_claim`): the rule is about this host only (a fleet's
hosts' places are theirs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpumon.alerting.alert_event import AlertEvent
from gpumon.alerting.grammar import SHARED, Rule, RuleKind, parse_gpus, rule_error
from gpumon.model import Snapshot
from gpumon.sharing.view import UseWithoutClaim

WORD = "unclaimed"
WithoutClaim = Callable[[Snapshot], Sequence[UseWithoutClaim]]


def parse_unclaimed_rule(text: str, tokens: list[tuple[str, int, int]]) -> Rule:
    fields: dict = {"text": text, "metric": WORD, "op": ">", "threshold": 0.0, "kind": UNCLAIMED}
    rest = iter(tokens[1:])
    for tok in rest:
        if tok[0].lower() != "on" or "gpus" in fields:
            raise rule_error(text, tok[1], tok[2], f"unexpected {tok[0]!r}: '{WORD}' takes only 'on GPUS'")
        arg = next(rest, None)
        if arg is None:
            raise rule_error(text, len(text), len(text) + 1, "'on' needs a value")
        fields["gpus"] = parse_gpus(arg, text)
    return Rule(**fields)


@dataclass
class UnclaimedAlerts:
    """The `unclaimed` rules of one AlertEngine: one firing per rule and process on a card."""

    rules: list[tuple[int, Rule]]
    without_claim: WithoutClaim

    def __post_init__(self) -> None:
        self._firing: dict[tuple[int, int, int], UseWithoutClaim] = {}  # (rule, card, pid) -> the use

    def evaluate(self, snapshot: Snapshot) -> list[AlertEvent]:
        uses = self.without_claim(snapshot)
        events: list[AlertEvent] = []
        now: set[tuple[int, int, int]] = set()
        for rule_i, rule in self.rules:
            for use in uses:
                if not rule.applies_to(use.gpu):
                    continue
                key = (rule_i, use.gpu, use.pid)
                now.add(key)
                if key not in self._firing:
                    events.append(_event("firing", rule, use, snapshot))
                self._firing[key] = use
        for key in [k for k in self._firing if k not in now]:
            events.append(_event("resolved", dict(self.rules)[key[0]], self._firing.pop(key), snapshot))
        return events

    def firing_cards(self) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        rules = dict(self.rules)
        for (rule_i, card, _), _use in self._firing.items():
            out.setdefault(card, set()).add(rules[rule_i].text)
        return out


def _event(kind: str, rule: Rule, use: UseWithoutClaim, snapshot: Snapshot) -> AlertEvent:
    name = next((g.name for g in snapshot.gpus if g.index == use.gpu), "")
    return AlertEvent(kind, rule.text, use.gpu, use.uuid or "", WORD, 1.0 if kind == "firing" else 0.0, 0.0,
                      snapshot.time, name, use=use)


UNCLAIMED = RuleKind((WORD,), scope=SHARED, whole=parse_unclaimed_rule,
                     promql=lambda rule, cards: f"gpumon_process_without_claim{cards} == 1",
                     summary=": {{ $labels.user }}'s process {{ $labels.pid }}, without a claim on a card "
                             "{{ $labels.kind }} by {{ $labels.holder }}")
