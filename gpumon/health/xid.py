"""XID errors: NVIDIA's catalogue of the codes after which a card cannot be trusted (with what
fixes each), the site's policy over them (`[health.xid]`: codes added to or removed from the fatal
ones, codes that warn, and "N times within D" thresholds: `XidPolicy`, read by the health verdict
and by failover alike), and the recent XIDs of each card, in words, for its panel. The events
themselves come from the card backends (cards/xid_events.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.errors import UsageError
from gpumon.units import parse_duration

RECENT_S = 3600.0  # a panel shows a card's XIDs of the last hour
KEEP = 3  # … at most this many, newest first

# XIDs after which the card cannot be trusted until it is reset (NVIDIA's XID catalogue,
# docs.nvidia.com/deploy/xid-errors): the programs on it have lost their context or their memory
# may be corrupt. Failover moves jobs off a card that reports one; the health verdict fails it.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "fell off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# Codes a site may name in [health.xid] (they warn or count only when told to): what the catalogue says.
XID_WORDS: dict[int, str] = {
    13: "graphics engine exception (usually the program's own fault)",
    31: "GPU memory page fault (usually the program's own fault)",
    43: "GPU stopped processing (a program's fault ended it)",
    45: "preemptive cleanup after a program ended",
    61: "internal micro-controller breakpoint or warning",
    62: "internal micro-controller halt",
    68: "video processor exception",
    69: "graphics engine class error",
    154: "GPU recovery action changed",
}
# What fixes each, after the catalogue's recommended actions.
XID_ACTIONS: dict[int, str] = {
    48: "drain the card and reset it (nvidia-smi -r); if it happens again, the card needs service (RMA)",
    63: "drain the card and reset it so the remap or retirement takes effect",
    64: "reset the card; if the failure repeats, the card needs service (RMA)",
    74: "check the NVLink bridge or baseboard, then reset the card; if it repeats, service (RMA)",
    79: "reset the card or reboot; check its power, cooling and seating; if it repeats, service (RMA)",
    92: "watch its ECC counters; if the rate stays high, the card needs service (RMA)",
    94: "restart the programs that used it; reset the card when it is free to remap the row",
    95: "reset the card (every program on it is affected)",
    119: "reset the card; if it repeats, update the driver and GPU firmware",
    120: "reset the card; if it repeats, update the driver and GPU firmware",
}


# -- the site's policy: which XIDs fail a card, which warn, and which count only when they repeat --

MAX_REPEATS = 64  # a threshold counts at most this many XIDs of its code


@dataclass(frozen=True)
class XidThreshold:
    """`count` XIDs of `code` within `within_s` seconds give the card `verdict`."""

    code: int
    count: int
    within_s: float
    verdict: str  # "warn" | "fail"


@dataclass(frozen=True)
class XidPolicy:
    fatal: frozenset[int] = frozenset(FATAL_XIDS)
    warn: frozenset[int] = frozenset()
    thresholds: tuple[XidThreshold, ...] = ()

    def noted(self, code: int) -> bool:
        """Whether an XID of this code counts for anything (the others are programs' own faults)."""
        return code in self.fatal or code in self.warn or any(t.code == code for t in self.thresholds)

    def judge(self, xids: Iterable[tuple[int, float]], now: float, window_s: float) -> list[XidFinding]:
        """What a card's XIDs ((code, unix time), newest first) say now: each fatal or warning XID
        within the window, and each threshold reached within its own span."""
        xids = tuple(xids)
        found = [XidFinding(code, "fail" if code in self.fatal else "warn", when, 1, 0.0)
                 for code, when in xids if now - when < window_s and (code in self.fatal or code in self.warn)]
        for rule in self.thresholds:
            times = [when for code, when in xids if code == rule.code and now - when < rule.within_s]
            if len(times) >= rule.count:
                found.append(XidFinding(rule.code, rule.verdict, times[0], len(times), rule.within_s))
        return found

    def expires(self, xids: Iterable[tuple[int, float]], window_s: float) -> float:
        """When the first of these XIDs leaves what the policy counts (the verdict may change then)."""
        spans = {rule.code: rule.within_s for rule in self.thresholds}
        ends = [when + max(window_s if code in self.fatal or code in self.warn else 0.0, spans.get(code, 0.0))
                for code, when in xids]
        return min(ends, default=float("inf"))

    def keep(self) -> int:
        """How many XIDs a card must remember for the thresholds to be judged."""
        return max([16, *(t.count for t in self.thresholds)])


@dataclass(frozen=True)
class XidFinding:
    code: int
    verdict: str
    when: float  # the newest XID that counts
    count: int  # 1, or how many a threshold counted
    within_s: float  # a threshold's span (0: a single XID)


def words(code: int) -> str:
    return FATAL_XIDS.get(code) or XID_WORDS.get(code) or "see NVIDIA's XID catalogue"


def action(code: int) -> str:
    return XID_ACTIONS.get(code) or "check the programs that used the card; reset it if the XID repeats"


def parse_policy(table: Mapping[str, Any], where: str) -> XidPolicy:
    """[health.xid]: add_fatal, remove_fatal, warn (lists of codes) and [[health.xid.threshold]]
    (code, count, within, verdict); UsageError names the bad key."""
    known = ("add_fatal", "remove_fatal", "warn", "threshold")
    for key in table:
        if key not in known:
            raise UsageError(f"{where}: unknown key 'health.xid.{key}' (known: {', '.join(known)})")
    add, remove, warn = (_codes(table.get(key, []), f"{where}: 'health.xid.{key}'")
                         for key in ("add_fatal", "remove_fatal", "warn"))
    thresholds = table.get("threshold", [])
    if isinstance(thresholds, Mapping):
        thresholds = [thresholds]
    if not isinstance(thresholds, list):
        raise UsageError(f"{where}: [[health.xid.threshold]] must be tables of code, count, within, verdict")
    parsed = tuple(_threshold(t, f"{where}: [[health.xid.threshold]] #{i + 1}") for i, t in enumerate(thresholds))
    return XidPolicy((frozenset(FATAL_XIDS) | add) - remove - warn, warn, parsed)


def _codes(value: Any, where: str) -> frozenset[int]:
    if not isinstance(value, list) or not all(type(v) is int and 0 < v < 1 << 16 for v in value):
        raise UsageError(f"{where} must be a list of XID codes, like [13, 43]")
    return frozenset(value)


def _threshold(raw: Any, where: str) -> XidThreshold:
    if not isinstance(raw, Mapping):
        raise UsageError(f"{where} must be a table")
    for key in raw:
        if key not in ("code", "count", "within", "verdict"):
            raise UsageError(f"{where}: unknown key {key!r} (known: code, count, within, verdict)")
    code, count, within, verdict = raw.get("code"), raw.get("count"), raw.get("within"), raw.get("verdict", "fail")
    if type(code) is not int or not 0 < code < 1 << 16:
        raise UsageError(f"{where}: 'code' must be an XID code, like 43")
    if type(count) is not int or not 1 <= count <= MAX_REPEATS:
        raise UsageError(f"{where}: 'count' must be a whole number from 1 to {MAX_REPEATS}")
    if not isinstance(within, str):
        raise UsageError(f"{where}: 'within' must be a duration like \"10m\"")
    try:
        span = parse_duration(within)
    except UsageError as exc:
        raise UsageError(f"{where}: 'within': {exc}") from None
    if span <= 0:
        raise UsageError(f"{where}: 'within' must be longer than 0 s")
    if verdict not in ("warn", "fail"):
        raise UsageError(f"{where}: 'verdict' must be \"warn\" or \"fail\"")
    return XidThreshold(code, count, span, verdict)


class RecentXids:
    """The last few XIDs of each card."""

    def __init__(self) -> None:
        self._seen: dict[int, deque[tuple[int, float]]] = {}

    def record(self, index: int, code: int, when: float) -> None:
        self._seen.setdefault(index, deque(maxlen=KEEP)).appendleft((code, when))

    def texts(self, index: int, now: float) -> tuple[str, ...]:
        """'XID 79 2m ago', newest first; nothing older than RECENT_S."""
        return tuple(f"XID {code} {_ago(now - when)}" for code, when in self._seen.get(index, ())
                     if now - when < RECENT_S)


def _ago(seconds: float) -> str:
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m ago"
    return f"{seconds // 3600:.0f}h ago"
