"""Rules about who holds the cards: `idle > DURATION [and mem > SIZE] [on GPUS]`.

A holder (owners/holders.py) is idle while every process of it shows 0 % SM; `idle > 30m` fires
when one has held its cards that way for longer than 30 minutes as gpumon has seen it (idle time
counts from when gpumon first saw the holder: a watch started a minute ago cannot know more), and
`mem > 10G` adds that it holds more than that much GPU memory. The duration is in the condition, so
`for` and `clear` do not apply; `on GPUS`: a holder holding any of those cards.

Which holders: each Slurm job, Kubernetes pod and container, and a user only where none of that
user's processes on the host run in one (so one idle job fires once, not again for its user). It
resolves when the holder computes again, holds less than `mem`, or lets go of the cards (its
processes gone: the resolved event's holder then has `processes` 0 and `sm_util` null; a pod or job
holding whole cards of a cluster read through Prometheus has `processes` 0 throughout, and
`sm_util` its cards' utilisation while it holds them). The event names the holder,
its user, host, cards and memory (`holder`, as `gpumon users --json` has it), so a hook can write
to them.

Pure, like the other rules: time comes from the snapshots (a replayed recording gives the same events).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gpumon.alerting.alert_event import AlertEvent
from gpumon.alerting.grammar import HOLDER, OPS, SHARED, Rule, RuleKind, parse_gpus, rule_error
from gpumon.errors import UsageError
from gpumon.model import Snapshot
from gpumon.owners.holders import Holder, HolderTracker
from gpumon.units import DURATION_EXAMPLES, parse_duration, parse_size

HOLDER_METRICS = ("idle",)
LONGER = (">", ">=")  # `idle < 5m` would be true of everyone who just stopped: not a rule anyone means


@dataclass(frozen=True)
class HolderRule(Rule):
    mem_op: str | None = None  # `and mem > SIZE`: the holder's GPU memory, summed over its cards
    mem_threshold: float | None = None

    def matches(self, holder: Holder) -> bool:
        if self.gpus is not None and not self.gpus.intersection(holder.cards):
            return False
        if holder.idle_s is None or not OPS[self.op](holder.idle_s, self.threshold):
            return False
        if self.mem_op is None:
            return True
        return holder.gpu_memory is not None and OPS[self.mem_op](holder.gpu_memory, self.mem_threshold)


def parse_holder_rule(text: str, tokens: list[tuple[str, int, int]]) -> HolderRule:
    """`tokens`: the rule's words with their columns, the first being the metric (idle)."""
    end = (len(text), len(text) + 1)
    rest = iter(tokens[1:])
    op = next(rest, None)
    if op is None or op[0] not in LONGER:
        where = op[1:] if op else end
        raise rule_error(text, *where, "expected > or >= after 'idle', e.g. 'idle > 30m'")
    fields: dict[str, Any] = {"text": text, "metric": "idle", "op": op[0], "kind": IDLE,
                              "threshold": _duration(text, next(rest, None))}
    seen: set[str] = set()
    for tok in rest:
        word = tok[0].lower()
        if word in ("for", "clear"):
            raise rule_error(text, tok[1], tok[2], f"'{word}' does not apply to idle: the duration is in the "
                                              "condition (idle > 30m)")
        if word not in ("and", "on") or word in seen:
            raise rule_error(text, tok[1], tok[2], f"unexpected {tok[0]!r}: expected 'and mem > SIZE' or 'on GPUS'")
        seen.add(word)
        if word == "on":
            arg = next(rest, None)
            if arg is None:
                raise rule_error(text, *end, "'on' needs a value")
            fields["gpus"] = parse_gpus(arg, text)
            continue
        what, mem_op, size = next(rest, None), next(rest, None), next(rest, None)
        if what is None or what[0].lower() != "mem":
            raise rule_error(text, *(what[1:] if what else end), "expected 'mem' after 'and' (and mem > 10G)")
        if mem_op is None or mem_op[0] not in OPS:
            raise rule_error(text, *(mem_op[1:] if mem_op else end),
                             f"expected a comparison ({' '.join(OPS)}) after mem")
        fields.update(mem_op=mem_op[0], mem_threshold=float(_size(text, size)))
    return HolderRule(**fields)


def _duration(text: str, tok: tuple[str, int, int] | None) -> float:
    if tok is None:
        raise rule_error(text, len(text), len(text) + 1, "expected a duration, e.g. 30m")
    try:
        return parse_duration(tok[0])
    except UsageError:
        raise rule_error(text, tok[1], tok[2], f"bad duration {tok[0]!r}: expected e.g. {DURATION_EXAMPLES}") from None


def _size(text: str, tok: tuple[str, int, int] | None) -> int:
    if tok is None:
        raise rule_error(text, len(text), len(text) + 1, "expected a size, e.g. 10G")
    try:
        if tok[0].endswith("%"):
            raise UsageError("a holder's memory is a size")
        return parse_size(tok[0])
    except UsageError:
        raise rule_error(text, tok[1], tok[2], f"bad size {tok[0]!r}: expected e.g. 10G or 512M") from None


def alerted(holders: tuple[Holder, ...]) -> list[Holder]:
    """The holders rules fire for: every job, pod and container, and the users none of whose
    processes run in one."""
    grouped = {h.user or "?" for h in holders if h.kind != "user"}
    return [h for h in holders if h.kind != "user" or h.id not in grouped]


class HolderAlerts:
    """The holder rules of one AlertEngine: a HolderTracker fed every snapshot it evaluates (the
    engine's own, or one its caller feeds the same snapshots: a snapshot read twice is read once)."""

    def __init__(self, rules: list[tuple[int, HolderRule]], tracker: HolderTracker | None = None) -> None:
        self.rules = rules
        self._rule = dict(rules)
        self.tracker = tracker if tracker is not None else HolderTracker()
        self._firing: dict[tuple[int, str, str, str], Holder] = {}  # (rule, host, kind, id) -> as last seen

    def evaluate(self, snapshot: Snapshot) -> list[AlertEvent]:
        holders = alerted(self.tracker.update(snapshot))
        events: list[AlertEvent] = []
        now: dict[tuple[int, str, str, str], Holder] = {}
        for rule_i, rule in self.rules:
            for holder in holders:
                key = (rule_i, holder.host, holder.kind, holder.id)
                now[key] = holder
                if key not in self._firing and rule.matches(holder):
                    self._firing[key] = holder
                    events.append(_event("firing", rule, holder, snapshot))
                elif key in self._firing and rule.matches(holder):
                    self._firing[key] = holder
        for key, last in list(self._firing.items()):
            current = now.get(key)
            rule = self._rule[key[0]]
            if current is None or not rule.matches(current):  # computing again, less memory, or gone
                del self._firing[key]
                # A holder that let go is told by no processes (what it held stays, for the message).
                gone = dataclasses.replace(last, processes=0, idle_s=None, sm_util=None, power_w=None)
                events.append(_event("resolved", rule, current or gone, snapshot))
        return events

    def firing_cards(self) -> dict[int, set[str]]:
        """Card index -> texts of the holder rules firing on a holder of it."""
        out: dict[int, set[str]] = {}
        for (rule_i, *_), holder in self._firing.items():
            for card in holder.cards:
                out.setdefault(card, set()).add(self._rule[rule_i].text)
        return out


def _event(kind: str, rule: HolderRule, holder: Holder, snapshot: Snapshot) -> AlertEvent:
    """About the holder's first card (gpu, uuid), and all of it in `holder`."""
    value = holder.idle_s if kind == "firing" and holder.idle_s is not None else 0.0
    gpu = holder.cards[0] if holder.cards else None
    uuid = holder.uuids[0] if holder.uuids else None
    name = next((g.name for g in snapshot.gpus if g.index == gpu), "")
    return AlertEvent(kind, rule.text, gpu, uuid or "", "idle", value, rule.threshold, snapshot.time,
                      name, holder=holder)


def needs_processes(rules: list[Rule]) -> bool:
    """Holder rules (and `unclaimed`: whose each process is) read who runs each process: the
    sampler must enrich them."""
    return any(r.kind is not None and r.kind.scope in (HOLDER, SHARED) for r in rules)


IDLE = RuleKind(HOLDER_METRICS, scope=HOLDER, whole=parse_holder_rule,
                not_in_promql="who holds a card idle is known to gpumon watch alone (it follows each process's SM %)")
