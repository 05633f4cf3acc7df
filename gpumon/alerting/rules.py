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

The scrape thread of the Prometheus exporter asks which rules fire while the event loop evaluates
them: it reads a copy the engine publishes after each change, never the live states.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumon.counters import HealthReason
from gpumon.errors import UsageError
from gpumon.model import THROTTLE_REASONS, GpuSample, Snapshot
from gpumon.units import format_cpu_list, parse_duration, parse_size

if TYPE_CHECKING:
    from gpumon.owners.holders import Holder

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
}
THROTTLE_GROUPS = {"thermal": {"sw_thermal", "hw_thermal"}, "power": {"sw_power_cap", "hw_power_brake"}}
THROTTLE_NAMES = set(THROTTLE_REASONS.values())


# Metrics compared against a value, and how each is read from a card (None: the card does not say).
METRICS: dict[str, Callable[[GpuSample], float | None]] = {
    "util": lambda g: g.utilization_gpu,
    "mem": lambda g: g.memory_percent,
    "mem_used": lambda g: g.memory_used,
    "temp": lambda g: g.temperature,
    "power": lambda g: g.power_draw,
    "fan": lambda g: g.fan,
    "clock_sm": lambda g: g.clock_sm,
    "procs": lambda g: len(g.processes) if g.state == "ok" else None,
    "ecc": lambda g: g.ecc_errors_uncorrected,
    # Card health counters (gpumon/counters.py); the rate is kept per second.
    "mem_temp": lambda g: g.counters.memory_temperature if g.counters else None,
    "pcie_replay_rate": lambda g: g.counters.pcie_replay_rate if g.counters else None,
    "correctable_remaps": lambda g: g.counters.remapped_rows_correctable if g.counters else None,
}
# Yes-or-no health counters, written alone like `lost`.
FLAGS: dict[str, Callable[[GpuSample], bool | None]] = {
    "remap_pending": lambda g: g.counters.remapped_rows_pending if g.counters else None,
    "remap_failure": lambda g: g.counters.remapped_rows_failure if g.counters else None,
}
RATES = {"pcie_replay_rate"}
PER_SECOND = {"/s": 1.0, "/min": 60.0, "/h": 3600.0}
VERDICT_LEVEL = {"ok": 0.0, "warn": 1.0, "fail": 2.0}
SPECIAL = ("lost", "xid", "throttle", "fabric", "health", *FLAGS, "unreachable")
XID_QUIET_S = 600.0  # an xid rule resolves after this long without an XID, unless `for` says otherwise
FABRIC_NOT_READY = {"not_started", "in_progress", "failed"}


class RuleError(UsageError):
    """A rule that does not parse; the message shows the rule with a caret under the bad part."""


@dataclass(frozen=True)
class Rule:
    text: str
    metric: str
    op: str = ">"
    threshold: float = 0.0
    percent: bool = False  # power given as % of the limit
    duration: float = 0.0
    clear: float | None = None
    gpus: frozenset[int] | None = None
    reasons: frozenset[str] = frozenset()  # throttle rules

    def applies_to(self, index: int) -> bool:
        return self.gpus is None or index in self.gpus

    def value(self, gpu: GpuSample) -> float | None:
        """The number this rule compares, or None when the card does not say."""
        if self.metric == "lost":
            return 1.0 if gpu.state == "lost" else 0.0
        if self.metric == "unreachable":
            return None  # a host's condition, not a card's
        if self.metric == "health":  # a lost card's verdict is news: it fails
            return None if gpu.health is None or gpu.state == "stale" else VERDICT_LEVEL[gpu.health.verdict]
        if gpu.state in ("lost", "stale"):  # a card that does not answer says nothing new
            return None
        if self.metric in FLAGS:
            flag = FLAGS[self.metric](gpu)
            return None if flag is None else float(flag)
        if self.metric == "fabric":
            return None if gpu.fabric is None else float(gpu.fabric in FABRIC_NOT_READY)
        if self.metric == "throttle":
            if gpu.throttle_reasons is None:
                return None
            return 1.0 if self.reasons & set(gpu.throttle_reasons) else 0.0
        if self.metric == "power" and self.percent:
            return gpu.power_percent
        return METRICS[self.metric](gpu)

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)

    def cleared(self, value: float) -> bool:
        """True when a firing alert's condition is over (past the clear value if one is set)."""
        if self.clear is None:
            return not self.holds(value)
        return not OPS[self.op](value, self.clear)


_TOKEN = re.compile(r"\S+")


def rule_error(text: str, start: int, end: int, message: str) -> RuleError:
    caret = " " * start + "^" * max(1, end - start)
    shown = text.replace("\n", " ").replace("\r", " ")  # keep the caret under the right column
    return RuleError(f"alert rule: {message}\n  {shown}\n  {caret}")


def parse_rule(text: str) -> Rule:
    tokens = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]
    if not tokens:
        raise RuleError("alert rule is empty: expected e.g. 'temp > 85 for 30s'")
    pos = 0

    def take() -> tuple[str, int, int] | None:
        nonlocal pos
        if pos >= len(tokens):
            return None
        pos += 1
        return tokens[pos - 1]

    word, start, end = take()  # type: ignore[misc]
    metric = word.lower()
    if metric == "idle":  # about who holds the cards, not about a card
        from gpumon.alerting.holder_rules import parse_holder_rule
        return parse_holder_rule(text, tokens)
    fields: dict[str, Any] = {"text": text, "metric": metric}
    if metric in ("lost", "fabric", "unreachable", *FLAGS):
        fields.update(op="==", threshold=1.0)
    elif metric == "health":
        level = "warn" if pos >= len(tokens) or tokens[pos][0].lower() in ("for", "on") else take()[0]  # type: ignore[index]
        if level.lower() not in ("warn", "fail"):
            bad = tokens[pos - 1]
            raise rule_error(text, bad[1], bad[2], f"health takes warn or fail, not {level!r}")
        fields.update(op=">=", threshold=VERDICT_LEVEL[level.lower()])
    elif metric == "throttle":
        reason = take()
        if reason is None:
            raise rule_error(text, len(text), len(text) + 1, "throttle needs a reason: thermal, power, hw_slowdown, …")
        name = reason[0].lower()
        reasons = THROTTLE_GROUPS.get(name, {name} if name in THROTTLE_NAMES else None)
        if reasons is None:
            known = ", ".join(sorted(THROTTLE_GROUPS) + sorted(THROTTLE_NAMES))
            raise rule_error(text, reason[1], reason[2], f"unknown throttle reason {reason[0]!r} (known: {known})")
        fields.update(op="==", threshold=1.0, reasons=frozenset(reasons))
    elif metric == "xid" and (pos >= len(tokens) or tokens[pos][0].lower() in ("for", "on")):
        fields.update(op="!=", threshold=0.0)  # any XID
    elif metric in METRICS or metric == "xid":
        op_tok = take()
        if op_tok is None or op_tok[0] not in OPS:
            where = op_tok or ("", len(text), len(text) + 1)
            raise rule_error(text, where[1], where[2], f"expected a comparison ({' '.join(OPS)}) after {word!r}")
        val_tok = take()
        if val_tok is None:
            raise rule_error(text, len(text), len(text) + 1, "expected a value to compare with")
        threshold, percent = _value(metric, val_tok, text)
        fields.update(op=op_tok[0], threshold=threshold, percent=percent)
    else:
        known = ", ".join(list(METRICS) + list(SPECIAL) + ["idle"])
        raise rule_error(text, start, end, f"unknown metric {word!r} (known: {known})")

    while (tok := take()) is not None:
        keyword = tok[0].lower()
        arg = take()
        if keyword not in ("for", "clear", "on") or keyword in fields.get("_seen", ()):
            raise rule_error(text, tok[1], tok[2],
                        f"unexpected {tok[0]!r}: expected 'for DURATION', 'clear VALUE' or 'on GPUS'")
        fields.setdefault("_seen", set()).add(keyword)
        if arg is None:
            raise rule_error(text, len(text), len(text) + 1, f"{keyword!r} needs a value")
        if keyword == "for":
            try:
                fields["duration"] = parse_duration(arg[0])
            except UsageError:
                raise rule_error(text, arg[1], arg[2],
                            f"bad duration {arg[0]!r}: expected e.g. 500ms, 30s, 10m, 1h") from None
        elif keyword == "clear":
            if metric in SPECIAL:
                raise rule_error(text, tok[1], tok[2], f"'clear' does not apply to {metric}")
            fields["clear"], _ = _value(metric, arg, text)
        else:
            fields["gpus"] = parse_gpus(arg, text)
    if metric == "xid" and "for" not in fields.get("_seen", ()):
        fields["duration"] = XID_QUIET_S
    fields.pop("_seen", None)
    return Rule(**fields)


def _value(metric: str, tok: tuple[str, int, int], text: str) -> tuple[float, bool]:
    raw = tok[0]
    if metric in RATES:
        unit = next((u for u in PER_SECOND if raw.lower().endswith(u)), None)
        try:
            if unit is None:
                raise ValueError
            return float(raw[: -len(unit)]) / PER_SECOND[unit], False
        except ValueError:
            raise rule_error(text, tok[1], tok[2], f"bad value {raw!r} for {metric}: expected a rate like 10/min "
                                              "(per /s, /min or /h)") from None
    try:
        if metric == "mem_used":
            return float(parse_size(raw)), False
        if raw.endswith("%"):
            if metric not in ("power", "mem", "util", "fan"):
                raise ValueError
            return float(raw[:-1]), metric == "power"
        return float(raw), False
    except (ValueError, UsageError):
        hint = ("a size like 8G" if metric == "mem_used"
                else "a number" + (" or a percentage" if metric == "power" else ""))
        raise rule_error(text, tok[1], tok[2], f"bad value {raw!r} for {metric}: expected {hint}") from None


def parse_gpus(tok: tuple[str, int, int], text: str) -> frozenset[int]:
    try:
        indices = frozenset(int(part) for part in tok[0].split(","))
    except ValueError:
        raise rule_error(text, tok[1], tok[2], f"bad card list {tok[0]!r}: expected indices like 0,1") from None
    if any(i < 0 for i in indices):
        raise rule_error(text, tok[1], tok[2], "card indices start at 0")
    return indices


@dataclass
class _State:
    firing: bool = False
    since: float | None = None  # when the condition (or its end) started holding
    value: float = 0.0


@dataclass(frozen=True)
class AlertEvent:
    event: str  # "firing" | "resolved"
    rule: str
    gpu: int | None  # None: about a whole host (unreachable)
    uuid: str | None
    metric: str
    value: float
    threshold: float
    time: float
    name: str = ""  # the card's name (from the driver); in hook environments, not in the JSON
    host: str | None = None  # the host of the card (the fleet's name for it, else the snapshot's)
    error: str | None = None  # unreachable: why
    reasons: tuple[HealthReason, ...] = ()  # a health rule: the card's verdict's reasons
    holder: Holder | None = None  # an idle rule: who holds the cards (gpu, uuid: its first card)

    def to_dict(self) -> dict[str, Any]:
        out = {"event": self.event, "rule": self.rule, "gpu": self.gpu, "uuid": self.uuid,
               "metric": self.metric, "value": self.value, "threshold": self.threshold, "time": self.time,
               "host": self.host}
        if self.error is not None:
            out["error"] = self.error
        if self.metric == "health":
            out["reasons"] = [r.to_dict() for r in self.reasons]
        if self.holder is not None:
            out["holder"] = {**self.holder.to_dict(), "host": self.host}
        return out


@dataclass
class AlertEngine:
    rules: list[Rule]
    _states: dict[tuple[int, int], _State] = field(default_factory=dict)
    _firing: dict[int, tuple[str, ...]] = field(default_factory=dict)
    _host_states: dict[tuple[int, str], _State] = field(default_factory=dict)
    _holders: Any = None  # holder_rules.HolderAlerts, when a rule is about holders
    tracker: Any = None  # the caller's HolderTracker (the TUI's users view's), else its own if a rule needs one

    def __post_init__(self) -> None:
        if about_holders := [(i, r) for i, r in enumerate(self.rules) if r.metric == "idle"]:
            from gpumon.alerting.holder_rules import HolderAlerts
            self._holders = HolderAlerts(about_holders, self.tracker)  # type: ignore[arg-type]

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
        self._firing = {gpu: tuple(texts) for gpu, texts in out.items()}

    def evaluate(self, snapshot: Snapshot) -> list[AlertEvent]:
        events: list[AlertEvent] = []
        for rule_i, rule in enumerate(self.rules):
            for gpu in snapshot.gpus:
                if rule.metric == "idle" or not rule.applies_to(gpu.index):
                    continue
                state = self._states.setdefault((rule_i, gpu.index), _State())
                if rule.metric == "xid":
                    event = self._xid_quiet(rule, state, gpu, snapshot.time)
                else:
                    value = rule.value(gpu)
                    event = None if value is None else self._step(rule, state, gpu, value, snapshot.time)
                if event:
                    events.append(dataclasses.replace(event, host=snapshot.host))
        if self._holders is not None:
            events += [dataclasses.replace(e, host=snapshot.host) for e in self._holders.evaluate(snapshot)]
        if events:
            self._publish()
        return events

    def xid(self, gpu: GpuSample, code: int, when: float) -> list[AlertEvent]:
        """An XID error arrived: matching xid rules fire now, not at the next sample, once per XID
        (each one is news: another code, or the same fault again). A rule resolves once no XID has
        come for its quiet period (at the first sample after that)."""
        events = []
        for rule_i, rule in enumerate(self.rules):
            if rule.metric != "xid" or not rule.applies_to(gpu.index) or not rule.holds(float(code)):
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
            if rule.metric != "unreachable":
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


def parse_rules(texts: Iterable[str]) -> list[Rule]:
    return [parse_rule(text) for text in texts]


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
