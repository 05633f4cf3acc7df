"""What a card's counters did lately, and its verdict: rates, what climbed within the window, the
fatal XIDs it reported. A backend hands each card's raw counters (a dict of CardCounters' fields,
read every `[health] interval`, the same dict in between) to `HealthTracker.card` once per sample; it
answers the CardCounters, rates filled in, and the card's verdict, both worked out again only when
something they depend on changed, so a sample costs a few attribute reads per card. (The raw
counters are a dict, not a CardCounters, so the object is built once a read, rates and all:
copying a 38-field frozen dataclass costs 20 µs.)

XIDs are events: the backend passes each one it delivers (to `watch` or the TUI) to `note_xid`
(kept when the XID policy counts its code, as many as its thresholds need), and the driver's other
health events to `note_event`. A card that comes back after being lost (a reset) starts with a
clean slate of both.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gpumon.counters import CLOCK_EVENT_TIMES, CardCounters, Health
from gpumon.health import rules as health
from gpumon.vendors import DEFAULT_VENDOR

RATE_SPAN_S = 60.0  # rates and throttled shares are over the last minute
MAX_READINGS = 512  # per card: the readings within the window (a few dozen at the default interval)
_GROUPS = {  # throttled shares: which clock-event reasons make up each group
    "throttled_power_pct": ("sw_power_cap", "hw_power_brake"),
    "throttled_thermal_pct": ("sw_thermal", "hw_thermal"),
    "throttled_hw_slowdown_pct": ("hw_thermal", "hw_power_brake"),
}
# What a later reading is compared with: the counters rates and climbing are measured on.
_CLIMBING = {"pcie_replay_counter", "remapped_rows_correctable", "nvlink_replay_errors", "nvlink_recovery_errors",
             "nvlink_tx_total", "nvlink_rx_total"}
_GROUP_INDICES = {name: tuple(CLOCK_EVENT_TIMES.index(r) for r in reasons) for name, reasons in _GROUPS.items()}


Raw = dict[str, Any]  # CardCounters' fields, as read


@dataclass
class _Card:
    readings: deque[tuple[float, Raw]] = field(default_factory=lambda: deque(maxlen=MAX_READINGS))
    raw: Raw | None = None  # the last raw counters seen, and what they became
    counters: CardCounters | None = None
    xids: list[tuple[int, float]] = field(default_factory=list)  # fatal XIDs: (code, unix time), newest first
    events: list[tuple[str, int, float]] = field(default_factory=list)  # the driver's: (name, data, unix time)
    xid_version: int = 0
    key: tuple[Any, ...] | None = None  # what the cached verdict was drawn from
    verdict: Health | None = None
    expires: float = float("inf")  # an XID leaves the window then: draw again
    state: str = "ok"


class HealthTracker:
    def __init__(self, settings: health.HealthSettings = health.HealthSettings()) -> None:
        self.settings = settings  # the rules, the window, the XID policy ([health])
        self._cards: dict[str, _Card] = {}
        self._lock = threading.Lock()  # note_xid comes from the XID thread

    def note_xid(self, key: str, code: int, when: float) -> None:
        """An XID of the card known by `key`; kept only when the XID policy counts its code (the
        others are programs' own faults)."""
        policy = self.settings.xid
        if not policy.noted(code):
            return
        with self._lock:
            card = self._cards.setdefault(key, _Card())
            card.xids = [(code, when), *card.xids][:policy.keep()]
            card.xid_version += 1

    def note_event(self, key: str, name: str, data: int, when: float) -> None:
        """One of the driver's other health events (health/driver_events.py) of the card known by `key`."""
        with self._lock:
            card = self._cards.setdefault(key, _Card())
            card.events = [(name, data, when), *card.events][:16]
            card.xid_version += 1

    def card(self, key: str, state: str, now: float, raw: Raw | None = None, fabric: str | None = None,
             ecc_uncorrected: int | None = None, vendor: str = DEFAULT_VENDOR,
             unread: str | None = None) -> tuple[CardCounters | None, Health]:
        """The card's counters (with rates) and verdict. `key`: its UUID (or "index:N"); `now`: unix
        time of the sample; `raw`: the counters as read (None: not read, e.g. lost); `vendor`: whose
        words the reasons use; `unread`: why none of the card's counters could be read (the
        verdict says so: its "ok" then rests on the card's state alone)."""
        card = self._cards.get(key)
        if card is None:
            card = self._cards[key] = _Card()
        if card.state == "lost" and state == "ok":  # back after a reset: its old XIDs are history
            with self._lock:
                card.xids, card.events, card.xid_version = [], [], card.xid_version + 1
        card.state = state
        if raw is not card.raw:
            card.raw = raw
            card.counters = self._with_rates(card, raw, now) if raw is not None else None
        settings = self.settings
        key_now = (id(card.counters), state, fabric, ecc_uncorrected, card.xid_version, id(settings), vendor, unread)
        if key_now != card.key or now >= card.expires or card.verdict is None:
            card.key = key_now
            card.verdict, card.expires = self._judge(card, state, fabric, ecc_uncorrected, now, settings,
                                                     vendor, unread)
        return card.counters, card.verdict

    def _judge(self, card: _Card, state: str, fabric: str | None, ecc: int | None, now: float,
               settings: health.HealthSettings, vendor: str = DEFAULT_VENDOR,
               unread: str | None = None) -> tuple[Health, float]:
        window = settings.window_s
        with self._lock:
            xids, events = tuple(card.xids), tuple(card.events)
        c = card.counters or CardCounters()
        not_ready, words = health.fabric_values(fabric)
        retired = None if c.retired_pages_sbe is None and c.retired_pages_dbe is None \
            else (c.retired_pages_sbe or 0) + (c.retired_pages_dbe or 0)
        margin = None if c.memory_temperature is None or c.memory_temperature_max is None \
            else c.memory_temperature_max - c.memory_temperature
        recovery, recovery_words = health.recovery_values(c.recovery_action)
        values = health.HealthValues(
            lost=int(state == "lost"), remapped_rows_pending=_flag(c.remapped_rows_pending),
            remapped_rows_failure=_flag(c.remapped_rows_failure), ecc_errors_uncorrected=ecc,
            retired_pages_pending=_flag(c.retired_pages_pending), retired_pages=retired,
            correctable_remaps_new=self._climbed(card, "remapped_rows_correctable", now, window),
            pcie_replays_per_min=None if c.pcie_replay_rate is None else c.pcie_replay_rate * 60,
            memory_temperature_margin=margin, memory_temperature=c.memory_temperature,
            memory_temperature_max=c.memory_temperature_max,
            nvlink_errors_new=_sum(self._climbed(card, "nvlink_replay_errors", now, window),
                                   self._climbed(card, "nvlink_recovery_errors", now, window)),
            throttled_hw_slowdown_pct=c.throttled_hw_slowdown_pct, fabric_not_ready=not_ready,
            fabric_words=words, xids=xids, events=events, now=now, recovery_action_needed=recovery,
            recovery_action=c.recovery_action or "", recovery_action_words=recovery_words,
            retired_pages_failed=c.retired_pages_failed,
            no_counters=int(unread is not None and state != "lost"), no_counters_words=unread or "", vendor=vendor,
        )
        expires = min([settings.xid.expires(xids, window), *(when + window for _, _, when in events)])
        return health.assess(values, settings), expires

    @staticmethod
    def _climbed(card: _Card, name: str, now: float, window: float) -> int | None:
        """How much a counter grew within the window (from the oldest reading in it, or the newest
        before it: a check run every so often compares with its last run)."""
        if not card.readings:
            return None
        newest = card.readings[-1][1].get(name)
        # The readings start one before the window (or at the first): the baseline, as _baseline would find.
        old = card.readings[0][1].get(name)
        if newest is None or old is None:
            return None
        return max(0, newest - old)

    def _with_rates(self, card: _Card, raw: Raw, now: float) -> CardCounters:
        readings = card.readings
        window = self.settings.window_s
        while len(readings) > 1 and readings[1][0] <= now - window:  # keep one reading from before it
            readings.popleft()
        previous = readings[-1] if readings else None
        minute = _baseline(readings, now - RATE_SPAN_S)
        readings.append((now, raw))
        values = dict(raw)
        get = raw.get
        if minute is not None and now > minute[0]:
            span, old = now - minute[0], minute[1]
            values["pcie_replay_rate"] = _rate(get("pcie_replay_counter"), old.get("pcie_replay_counter"), span)
            for group, indices in _GROUP_INDICES.items():
                values[group] = _share(get("clock_event_s"), old.get("clock_event_s"), indices, span)
        if previous is not None and now > previous[0]:
            span, old = now - previous[0], previous[1]
            for name, total in (("nvlink_tx", "nvlink_tx_total"), ("nvlink_rx", "nvlink_rx_total")):
                rate = _rate(get(total), old.get(total), span)
                values[name] = None if rate is None else round(rate)
        return CardCounters(**values)

    # -- for one-shot checks that run every so often (`gpumon health`) --

    def export_readings(self) -> dict[str, list[tuple[float, dict[str, Any]]]]:
        """Each card's readings within the window (plus the one before it), to remember until the
        next run: what climbing is measured against."""
        return {key: [(t, {k: v for k, v in raw.items() if k in _CLIMBING and v is not None})
                      for t, raw in card.readings]
                for key, card in self._cards.items() if card.readings}

    def import_readings(self, saved: dict[str, Any], now: float) -> None:
        window = self.settings.window_s
        for key, readings in saved.items():
            card = self._cards.setdefault(key, _Card())
            for when, raw in readings[-MAX_READINGS:]:
                if isinstance(raw, dict) and isinstance(when, (int, float)) and when < now:
                    # Only numbers (a file edited by hand must not break the sampling later).
                    card.readings.append((float(when), {k: v for k, v in raw.items() if k in _CLIMBING
                                                        and type(v) in (int, float)}))
            while len(card.readings) > 1 and card.readings[1][0] <= now - window:
                card.readings.popleft()


def _baseline(readings: deque[tuple[float, Raw]], since: float) -> tuple[float, Raw] | None:
    """The newest reading at or before `since` (so the span is at least the whole period), else the
    oldest one. Searched from the newest end: a minute back is a dozen readings."""
    for reading in reversed(readings):
        if reading[0] <= since:
            return reading
    return readings[0] if readings else None


def _flag(value: bool | None) -> int | None:
    return None if value is None else int(value)


def _sum(a: int | None, b: int | None) -> int | None:
    return None if a is None and b is None else (a or 0) + (b or 0)


def _rate(new: int | float | None, old: int | float | None, span: float) -> float | None:
    if new is None or old is None or new < old:  # a counter that went back: the driver was reloaded
        return None
    return (new - old) / span


def _share(new: tuple[float | None, ...] | None, old: tuple[float | None, ...] | None, indices: tuple[int, ...],
           span: float) -> float | None:
    """Percent of `span` the clocks were held down by any of the reasons at `indices` (capped at
    100: two reasons can hold at once)."""
    if new is None or old is None:
        return None
    parts = [new[i] - old[i] for i in indices if new[i] is not None and old[i] is not None and new[i] >= old[i]]
    if not parts:
        return None
    return round(min(100.0, 100.0 * sum(parts) / span), 1)
