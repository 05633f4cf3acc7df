"""The words every alert rule shares: the `Rule` record each kind of rule parses into, the
comparisons, the `for DURATION`, `clear VALUE` and `on GPUS` after a condition, and errors that
put a caret under the bad word. What each kind of rule means is `RuleKind`'s (alerting/kinds.py
lists them).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpumon.errors import UsageError
from gpumon.model import GpuSample
from gpumon.units import DURATION_EXAMPLES, parse_duration

OPS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
}
Token = tuple[str, int, int]  # a word and its columns in the rule's text

# How a kind's rules are evaluated by the engine (alerting/rules.py AlertEngine):
CARD = "card"  # each sample of each card: fires when the condition has held for DURATION
XID = "xid"  # each XID event fires; resolves after a quiet period
HOST = "host"  # each fleet host's reachability (AlertEngine.evaluate_host), never a card's
HOLDER = "holder"  # who holds the cards (alerting/holder_rules.py HolderAlerts)
SHARED = "shared"  # processes on cards others claim or reserved (alerting/sharing_rules.py UnclaimedAlerts)


class RuleError(UsageError):
    """A rule that does not parse; the message shows the rule with a caret under the bad part."""


def rule_error(text: str, start: int, end: int, message: str) -> RuleError:
    caret = " " * start + "^" * max(1, end - start)
    shown = text.replace("\n", " ").replace("\r", " ")  # keep the caret under the right column
    return RuleError(f"alert rule: {message}\n  {shown}\n  {caret}")


_TOKEN = re.compile(r"\S+")


class Words:
    """A rule's words with their columns, read left to right."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[Token] = [(m.group(), m.start(), m.end()) for m in _TOKEN.finditer(text)]
        self.pos = 0

    def take(self) -> Token | None:
        if self.pos >= len(self.tokens):
            return None
        self.pos += 1
        return self.tokens[self.pos - 1]

    def ends_condition(self) -> bool:
        """Nothing more, or only `for …` / `on …`: a kind whose argument may be left out."""
        return self.pos >= len(self.tokens) or self.tokens[self.pos][0].lower() in ("for", "on")

    def end(self) -> tuple[int, int]:
        """The columns just past the text: where a missing word is pointed at."""
        return len(self.text), len(self.text) + 1

    def error(self, tok: Token | None, message: str) -> RuleError:
        start, end = (tok[1], tok[2]) if tok is not None else self.end()
        return rule_error(self.text, start, end, message)


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
    kind: RuleKind | None = field(default=None, compare=False, repr=False)  # what it means; set by parse_rule

    def applies_to(self, index: int) -> bool:
        return self.gpus is None or index in self.gpus

    def value(self, gpu: GpuSample) -> float | None:
        """The number this rule compares, or None when the card does not say."""
        if self.kind is None or self.kind.value is None:
            return None
        return self.kind.value(self, gpu)

    def holds(self, value: float) -> bool:
        return OPS[self.op](value, self.threshold)

    def cleared(self, value: float) -> bool:
        """True when a firing alert's condition is over (past the clear value if one is set)."""
        if self.clear is None:
            return not self.holds(value)
        return not OPS[self.op](value, self.clear)


@dataclass(frozen=True)
class RuleKind:
    """One kind of rule, all of it in one place: the words it starts with, how the rest of its
    condition parses, how it reads a card, how the engine evaluates it, and how it is written in
    PromQL over the exporter's series (or why it cannot be)."""

    words: tuple[str, ...]
    # The condition after the first word -> Rule fields (op, threshold, …); the Words are past the first.
    condition: Callable[[str, Words], dict[str, Any]] | None = None
    scope: str = CARD
    value: Callable[[Rule, GpuSample], float | None] | None = None
    # (rule, the card selector `{gpu=~"0|1"}` or "") -> a PromQL expression true while it fires.
    promql: Callable[[Rule, str], str] | None = None
    not_in_promql: str = ""  # why no exported series can say it, where promql is None
    # `clear VALUE`: its value parsed like the condition's (None: the kind takes no clear).
    clear_value: Callable[[str, Token, Words], float] | None = None
    default_for: float = 0.0  # the duration when `for` is not given
    summary: str = ""  # what the exported alert's summary adds (Prometheus template text)
    # The whole rule, where the kind reads its own tail (for, on, …) rather than the shared one.
    whole: Callable[[str, list[Token]], Rule] | None = None


def parse_tail(words: Words, kind: RuleKind, metric: str, fields: dict[str, Any]) -> None:
    """`for DURATION`, `clear VALUE`, `on GPUS`, each at most once, into `fields`."""
    seen: set[str] = set()
    while (tok := words.take()) is not None:
        keyword = tok[0].lower()
        arg = words.take()
        if keyword not in ("for", "clear", "on") or keyword in seen:
            raise words.error(tok, f"unexpected {tok[0]!r}: expected 'for DURATION', 'clear VALUE' or 'on GPUS'")
        seen.add(keyword)
        if arg is None:
            raise words.error(None, f"{keyword!r} needs a value")
        if keyword == "for":
            try:
                fields["duration"] = parse_duration(arg[0])
            except UsageError:
                raise words.error(arg, f"bad duration {arg[0]!r}: expected e.g. {DURATION_EXAMPLES}") from None
        elif keyword == "clear":
            if kind.clear_value is None:
                raise words.error(tok, f"'clear' does not apply to {metric}")
            fields["clear"] = kind.clear_value(metric, arg, words)
        else:
            fields["gpus"] = parse_gpus(arg, words.text)
    if "for" not in seen and kind.default_for:
        fields["duration"] = kind.default_for


def parse_gpus(tok: Token, text: str) -> frozenset[int]:
    try:
        indices = frozenset(int(part) for part in tok[0].split(","))
    except ValueError:
        raise rule_error(text, tok[1], tok[2], f"bad card list {tok[0]!r}: expected indices like 0,1") from None
    if any(i < 0 for i in indices):
        raise rule_error(text, tok[1], tok[2], "card indices start at 0")
    return indices


def gpu_selector(rule: Rule) -> str:
    """The PromQL label matchers of a rule's `on GPUS` (empty without one)."""
    return "" if rule.gpus is None else '{gpu=~"' + "|".join(str(i) for i in sorted(rule.gpus)) + '"}'
