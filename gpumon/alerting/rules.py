"""Alert rules: `METRIC OP VALUE [for DURATION] [clear VALUE] [on GPUS]`, and their evaluation.

Pure: no I/O, no clocks. Time comes from the snapshots, so a recording replayed at any speed gives
exactly the events of the live run. A rule fires once when its condition has held for DURATION and
resolves once when it has been false for DURATION (with `clear`, false means past the clear value),
so a noisy value does not flap.

Also accepted: `lost`, `xid`, `xid == 79`, `throttle thermal` (reason names or the groups
`thermal` and `power`), `ecc > 0`, `fabric` (an NVSwitch board's card not registered with the
fabric: fabric manager not running, still starting, or failed), `health` (the card's verdict is
warn or fail; `health fail`: fail only; the event carries the reasons), the health counters
`remap_pending`, `remap_failure`, `mem_temp > 90`, `correctable_remaps > 0` and
`pcie_replay_rate > 10/min` (a rate needs its unit: /s, /min or /h), `unreachable` (a fleet host,
evaluated per host by alerting.fleet_watch; never true of a card), and `idle > 30m` (a user, job,
pod or container holding cards without computing: alerting.holder_rules). An XID is an event, not a level:
an `xid` rule fires once per XID error (its code is the event's value) and resolves once no XID has
come for its quiet period, the rule's `for` (default 10 minutes).

Each kind of rule (its words, reading, evaluation, PromQL) is registered once in
alerting/kinds.py; this module is the engine that evaluates them, by the kind's scope.

The scrape thread of the Prometheus exporter asks which rules fire while the event loop evaluates
them: it reads a copy the engine publishes after each change, never the live states.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpumon.alerting.alert_event import AlertEvent
from gpumon.alerting.grammar import CARD, HOLDER, HOST, OPS, SHARED, XID, Rule, RuleError, parse_gpus, rule_error
from gpumon.alerting.holder_rules import HolderAlerts
from gpumon.alerting.kinds import parse_rule, parse_rules
from gpumon.alerting.sharing_rules import UnclaimedAlerts, WithoutClaim
from gpumon.model import GpuSample, Snapshot
from gpumon.units import format_cpu_list

# The names other modules take from here.
__all__ = ["OPS", "AlertEngine", "AlertEvent", "Rule", "RuleError", "missing_cards", "parse_gpus", "parse_rule",
           "parse_rules", "rule_error"]


@dataclass
class _State:
    firing: bool = False
    since: float | None = None  # when the condition (or its end) started holding
    value: float = 0.0


@dataclass
class AlertEngine:
    rules: list[Rule]
    _states: dict[tuple[int, int], _State] = field(default_factory=dict)
    _firing: dict[int, tuple[str, ...]] = field(default_factory=dict)
    _host_states: dict[tuple[int, str], _State] = field(default_factory=dict)
    _holders: Any = None  # holder_rules.HolderAlerts, when a rule is about holders
    tracker: Any = None  # the caller's HolderTracker (the TUI's users view's), else its own if a rule needs one
    # Snapshot -> the processes on cards others claim or reserved (this host's place: sharing/view);
    # None: `unclaimed` rules see none (a fleet's hosts: their places are theirs).
    without_claim: WithoutClaim | None = None
    _unclaimed: Any = None  # sharing_rules.UnclaimedAlerts, when a rule is about them

    def __post_init__(self) -> None:
        if about_holders := [(i, r) for i, r in enumerate(self.rules) if _scope(r) == HOLDER]:
            self._holders = HolderAlerts(about_holders, self.tracker)  # type: ignore[arg-type]
        if (about_shared := [(i, r) for i, r in enumerate(self.rules) if _scope(r) == SHARED]) \
                and self.without_claim is not None:
            self._unclaimed = UnclaimedAlerts(about_shared, self.without_claim)

    def firing(self) -> dict[int, tuple[str, ...]]:
        """Card index -> texts of the rules firing on it now. Safe from any thread: a copy made
        when the states last changed, replaced whole, never changed in place."""
        return self._firing

    def _publish(self) -> None:
        out: dict[int, list[str]] = {}
        for (rule_i, gpu), state in self._states.items():
            if state.firing:
                out.setdefault(gpu, []).append(self.rules[rule_i].text)
        for gpu, texts in (self._holders.firing_cards() if self._holders else {}).items():
            out.setdefault(gpu, []).extend(sorted(texts))
        for gpu, texts in (self._unclaimed.firing_cards() if self._unclaimed else {}).items():
            out.setdefault(gpu, []).extend(sorted(texts))
        self._firing = {gpu: tuple(texts) for gpu, texts in out.items()}

    def evaluate(self, snapshot: Snapshot) -> list[AlertEvent]:
        events: list[AlertEvent] = []
        for rule_i, rule in enumerate(self.rules):
            for gpu in snapshot.gpus:
                scope = _scope(rule)
                if scope not in (CARD, XID) or not rule.applies_to(gpu.index):
                    continue
                state = self._states.setdefault((rule_i, gpu.index), _State())
                if scope == XID:
                    event = self._xid_quiet(rule, state, gpu, snapshot.time)
                else:
                    value = rule.value(gpu)
                    event = None if value is None else self._step(rule, state, gpu, value, snapshot.time)
                if event:
                    events.append(dataclasses.replace(event, host=snapshot.host))
        if self._holders is not None:
            events += [dataclasses.replace(e, host=snapshot.host) for e in self._holders.evaluate(snapshot)]
        if self._unclaimed is not None and not snapshot.stale:
            events += [dataclasses.replace(e, host=snapshot.host) for e in self._unclaimed.evaluate(snapshot)]
        if events:
            self._publish()
        return events

    def xid(self, gpu: GpuSample, code: int, when: float) -> list[AlertEvent]:
        """An XID error arrived: matching xid rules fire now, not at the next sample, once per XID
        (each one is news: another code, or the same fault again). A rule resolves once no XID has
        come for its quiet period (at the first sample after that)."""
        events = []
        for rule_i, rule in enumerate(self.rules):
            if _scope(rule) != XID or not rule.applies_to(gpu.index) or not rule.holds(float(code)):
                continue
            state = self._states.setdefault((rule_i, gpu.index), _State())
            state.firing, state.since, state.value = True, when, float(code)  # `since`: the last XID seen
            events.append(self._event("firing", rule, gpu, float(code), when))
        if events:
            self._publish()
        return events

    def evaluate_host(self, host: str, unreachable: bool, now: float, error: str | None = None) -> list[AlertEvent]:
        """The `unreachable` rules for one fleet host: they fire and resolve like card rules."""
        events = []
        whole_host = GpuSample(index=-1, uuid="", name=host, pci_bus_id="")
        for rule_i, rule in enumerate(self.rules):
            if _scope(rule) != HOST:
                continue
            state = self._host_states.setdefault((rule_i, host), _State())
            event = self._step(rule, state, whole_host, 1.0 if unreachable else 0.0, now)
            if event:
                events.append(dataclasses.replace(event, gpu=None, uuid=None, host=host,
                                                  error=error if event.event == "firing" else None))
        return events

    def _xid_quiet(self, rule: Rule, state: _State, gpu: GpuSample, now: float) -> AlertEvent | None:
        if state.firing and state.since is not None and now > state.since and now - state.since >= rule.duration:
            state.firing, state.since = False, None
            return self._event("resolved", rule, gpu, 0.0, now)
        return None

    def _step(self, rule: Rule, state: _State, gpu: GpuSample, value: float, now: float) -> AlertEvent | None:
        """inactive -> pending (holding, for < DURATION) -> firing -> ending (cleared, for < DURATION) -> resolved."""
        if not state.firing:
            if not rule.holds(value):
                state.since = None
                return None
            state.since = now if state.since is None else state.since
            if now - state.since >= rule.duration:
                state.firing, state.since, state.value = True, None, value
                return self._event("firing", rule, gpu, value, now)
            return None
        if not rule.cleared(value):
            state.since = None
            return None
        state.since = now if state.since is None else state.since
        if now - state.since >= rule.duration:
            state.firing, state.since = False, None
            return self._event("resolved", rule, gpu, value, now)
        return None

    @staticmethod
    def _event(kind: str, rule: Rule, gpu: GpuSample, value: float, now: float) -> AlertEvent:
        reasons = gpu.health.reasons if rule.metric == "health" and gpu.health is not None else ()
        return AlertEvent(kind, rule.text, gpu.index, gpu.uuid or "", rule.metric, value, rule.threshold, now, gpu.name,
                          reasons=reasons)


def _scope(rule: Rule) -> str:
    return rule.kind.scope if rule.kind is not None else CARD


def missing_cards(rules: Iterable[Rule], snapshot: Snapshot, where: str = "this machine") -> str | None:
    """Why a rule's `on GPUS` names a card this snapshot (of `where`) does not have, or None. Rules
    are parsed before any card is known, so this waits for the first sample (or the cards' identity)."""
    have = sorted(g.index for g in snapshot.gpus)
    for rule in rules:
        absent = sorted(rule.gpus - set(have)) if rule.gpus is not None else []
        if absent:
            return (f"alert rule {rule.text!r}: no {_cards(absent, ', '.join(map(str, absent)))} on {where} "
                    f"(it has {_cards(have, format_cpu_list(have)) if have else 'no GPUs'})")
    return None


def _cards(indices: list[int], shown: str) -> str:
    return f"GPU{'s' if len(indices) > 1 else ''} {shown}"
