"""Is this card going bad? The verdict (ok / warn / fail) of each card, with reasons and actions.

The rules are data: RULES below, one row per check (what it reads, the condition, the verdict,
what is wrong, what fixes it, and where NVIDIA says so), in the spirit of DCGM's health watches
and NVIDIA's XID catalogue. The config's `[health]` table overrides a rule's threshold, verdict
("off" disables it, "ok" makes it a note) or action, and the window fatal XIDs and climbing
counters are judged over:

    [health]
    window = "10m"
    interval = "30s"      # how often the counters are read
    [health.rules.pcie_replays]
    threshold = 20        # replays a minute
    [health.rules.mem_temp]
    verdict = "off"

A verdict is drawn by `health.history.HealthTracker` once per sample of each card, from
the card's state, its counters (read every few seconds) and the fatal XIDs it reported within the
window; between counter reads the same verdict object is handed out again.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpumon.counters import VERDICTS, Health, HealthReason
from gpumon.errors import UsageError
from gpumon.health.xid import FATAL_XIDS, XID_ACTIONS
from gpumon.units import parse_duration
from gpumon.vendors import DEFAULT_VENDOR, vendor

DEFAULT_WINDOW_S = 600.0
DEFAULT_INTERVAL_S = 30.0
FABRIC_NOT_READY = {"not_started": "has not started", "in_progress": "is still registering the card",
                    "failed": "failed to register the card"}
_OPS: dict[str, Callable[[float, float], bool]] = {">": operator.gt, ">=": operator.ge, "<": operator.lt,
                                                   "<=": operator.le, "==": operator.eq}


@dataclass(frozen=True)
class HealthRule:
    code: str
    value: str  # a name of HealthValues' fields: what the rule reads
    op: str
    threshold: float
    verdict: str  # "warn" | "fail" | "ok" (a note: said, the verdict unchanged) | "off"
    text: str  # what is wrong; {value}, {threshold}, {window} and HealthValues' fields are filled in
    action: str
    reference: str  # where NVIDIA (or DCGM, or the kernel) says so
    # The site's own action ([health.rules.CODE] action), for every vendor's cards alike.
    site_action: str | None = None

    def holds(self, value: float) -> bool:
        return _OPS[self.op](value, self.threshold)

    def words(self, vendor_name: str) -> tuple[str, str]:
        """(text, action) for a card of this vendor: its record's words where NVIDIA's would be wrong."""
        text, action = vendor(vendor_name).health_words.get(self.code, (self.text, self.action))
        return text, self.site_action or action


RULES: tuple[HealthRule, ...] = (
    HealthRule("lost", "lost", "==", 1, "fail", "the card fell off the bus (the driver says: GPU is lost)",
               "reset the card (nvidia-smi -r) or reboot; if it happens again, check its power and seating, "
               "then service (RMA)", "NVML GPU_IS_LOST; XID catalogue: XID 79"),
    HealthRule("remap_pending", "remapped_rows_pending", "==", 1, "fail",
               "a row remap is pending: memory with a known bad row is still in use",
               "reset the card to apply pending row remaps (drain its jobs first)",
               "NVIDIA A100/H100 row remapping guide; DCGM memory watch (DCGM_FR_PENDING_ROW_REMAP)"),
    HealthRule("remap_failure", "remapped_rows_failure", "==", 1, "fail",
               "row remapping failed: a bank has no spare rows left", "the card needs service (RMA)",
               "NVIDIA row remapping guide; DCGM memory watch (DCGM_FR_ROW_REMAP_FAILURE)"),
    HealthRule("ecc_uncorrected", "ecc_errors_uncorrected", ">", 0, "fail",
               "{value:g} uncorrectable ECC errors since the driver loaded",
               "drain and reset the card; if they come back, the card needs service (RMA)",
               "DCGM memory watch (volatile DBE); XID catalogue: XID 48; amdgpu RAS <block>_err_count (ue)"),
    HealthRule("retired_pending", "retired_pages_pending", "==", 1, "fail",
               "memory pages are waiting to be retired", "reset the card or reboot so the pages are retired",
               "NVIDIA dynamic page retirement guide; DCGM memory watch (DCGM_FR_PENDING_PAGE_RETIREMENTS); "
               "amdgpu RAS gpu_vram_bad_pages (P)"),
    HealthRule("retire_failed", "retired_pages_failed", ">", 0, "fail",
               "{value:g} bad memory pages could not be retired: they may still be in use",
               "reboot so the driver retires them as it loads; if they stay unretired, the card needs service (RMA)",
               "amdgpu RAS gpu_vram_bad_pages (F: unable to reserve)"),
    HealthRule("retired_pages", "retired_pages", ">=", 60, "fail", "{value:g} memory pages retired",
               "the card needs service (RMA): past NVIDIA's limit of retired pages",
               "DCGM_LIMIT_MAX_RETIRED_PAGES (60); NVIDIA dynamic page retirement guide"),
    HealthRule("correctable_remaps", "correctable_remaps_new", ">", 0, "warn",
               "{value:g} new correctable row remaps within {window}",
               "keep watching it; if the count keeps climbing, plan to have the card serviced",
               "NVIDIA row remapping guide"),
    HealthRule("pcie_replays", "pcie_replays_per_min", ">", 8, "warn",
               "PCIe replays climbing: {value:.0f} a minute (more than {threshold:g})",
               "reseat the card and check its slot or riser; run the PCIe diagnostics (dcgmi diag)",
               "DCGM PCIe watch: DCGM_LIMIT_MAX_PCIREPLAY_RATE, 8 a minute"),
    HealthRule("mem_temp", "memory_temperature_margin", "<=", 5, "warn",
               "memory at {memory_temperature} °C, {margin} of {memory_temperature_max} °C",
               "check the card's cooling: airflow, fans, inlet temperature",
               "NVML memory max operating temperature (nvidia-smi -q: Memory Max Operating Temp)"),
    HealthRule("nvlink_errors", "nvlink_errors_new", ">", 0, "warn",
               "{value:g} new NVLink replay or recovery errors within {window}",
               "check the NVLink bridge or baseboard and reset the card; if it persists, service (RMA)",
               "DCGM NVLink watch (DCGM_FR_NVLINK_ERROR_THRESHOLD)"),
    HealthRule("hw_slowdown", "throttled_hw_slowdown_pct", ">", 20, "warn",
               "hardware slowdown {value:.0f}% of the last minute",
               "check the power supply and cooling: the card protects itself (HW slowdown, power brake)",
               "NVML clock events: HW slowdown, HW thermal, HW power brake"),
    HealthRule("fabric", "fabric_not_ready", "==", 1, "fail",
               "NVSwitch fabric {fabric_words}: CUDA cannot use the card",
               "start the fabric manager (systemctl start nvidia-fabricmanager) and read its log",
               "NVIDIA Fabric Manager user guide; nvmlDeviceGetGpuFabricInfo"),
    HealthRule("xid", "fatal_xid", "==", 1, "fail", "XID {xid} ({xid_words}) at {xid_time}",
               "{xid_action}", "NVIDIA XID catalogue (docs.nvidia.com/deploy/xid-errors)"),
    # A card the backend read no counter of: said, so its "ok" is not taken for a checked one.
    HealthRule("no_counters", "no_counters", "==", 1, "ok", "no health counters: {no_counters_words}",
               "none possible from here: only whether the card answers is judged", "gpumon"),
)


@dataclass(frozen=True, slots=True)
class HealthValues:
    """What the rules read of one card; None: not known (a rule about it says nothing)."""

    lost: int = 0
    remapped_rows_pending: int | None = None
    remapped_rows_failure: int | None = None
    ecc_errors_uncorrected: int | None = None
    retired_pages_pending: int | None = None
    retired_pages: int | None = None
    correctable_remaps_new: int | None = None
    pcie_replays_per_min: float | None = None
    memory_temperature_margin: int | None = None
    memory_temperature: int | None = None
    memory_temperature_max: int | None = None
    nvlink_errors_new: int | None = None
    throttled_hw_slowdown_pct: float | None = None
    fabric_not_ready: int | None = None
    fabric_words: str = ""
    fatal_xids: tuple[tuple[int, float], ...] = ()  # (code, unix time) within the window, newest first
    retired_pages_failed: int | None = None
    no_counters: int | None = None  # 1: the backend could read none of the card's counters
    no_counters_words: str = ""  # why not
    vendor: str = DEFAULT_VENDOR  # whose words the reasons use (the vendor's record: health_words)


@dataclass(frozen=True)
class HealthSettings:
    rules: tuple[HealthRule, ...] = RULES
    window_s: float = DEFAULT_WINDOW_S
    interval_s: float = DEFAULT_INTERVAL_S  # how often a backend reads the counters


_settings = HealthSettings()


def settings() -> HealthSettings:
    return _settings


def configure(table: Mapping[str, Any] | None, where: str = "config") -> HealthSettings:
    """Apply the config's [health] table for this process (every tracker reads it); UsageError names
    the bad key. An empty or missing table restores the defaults."""
    global _settings
    _settings = parse_settings(table or {}, where)
    return _settings


def parse_settings(table: Mapping[str, Any], where: str = "config") -> HealthSettings:
    known = {rule.code: rule for rule in RULES}
    for key in table:
        if key not in ("window", "interval", "rules"):
            raise UsageError(f"{where}: unknown key 'health.{key}' (known: window, interval, rules)")
    durations = {"window": DEFAULT_WINDOW_S, "interval": DEFAULT_INTERVAL_S}
    for key in durations:
        if key in table:
            if not isinstance(table[key], str):
                raise UsageError(f"{where}: 'health.{key}' must be a duration like \"10m\"")
            durations[key] = parse_duration(table[key])
    overrides = table.get("rules", {})
    if not isinstance(overrides, Mapping):
        raise UsageError(f"{where}: [health.rules] must be a table of rules by code")
    rules = dict(known)
    for code, change in overrides.items():
        if code not in known:
            raise UsageError(f"{where}: [health.rules.{code}]: no such rule (known: {', '.join(known)})")
        if not isinstance(change, Mapping):
            raise UsageError(f"{where}: [health.rules.{code}] must be a table")
        rules[code] = _override(known[code], change, f"{where}: [health.rules.{code}]")
    return HealthSettings(tuple(rules.values()), durations["window"], durations["interval"])


def _override(rule: HealthRule, change: Mapping[str, Any], where: str) -> HealthRule:
    fields: dict[str, Any] = {}
    for key, value in change.items():
        if key == "threshold":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"{where}: 'threshold' must be a number")
            fields["threshold"] = float(value)
        elif key == "verdict":
            if value not in ("warn", "fail", "ok", "off"):
                raise UsageError(f"{where}: 'verdict' must be \"warn\", \"fail\", \"ok\" or \"off\"")
            fields["verdict"] = value
        elif key == "action":
            if not isinstance(value, str) or not value.strip():
                raise UsageError(f"{where}: 'action' must be text")
            fields["action"] = fields["site_action"] = value
        else:
            raise UsageError(f"{where}: unknown key {key!r} (known: threshold, verdict, action)")
    return dataclasses.replace(rule, **fields)


def assess(values: HealthValues, settings: HealthSettings | None = None) -> Health:
    """The verdict: the worst of the rules that hold, each with its reason and action."""
    settings = settings or _settings
    reasons: list[HealthReason] = []
    worst = "ok"
    for rule in settings.rules:
        if rule.verdict == "off":
            continue
        found = _xid_reasons(rule, values, settings) if rule.value == "fatal_xid" else _reason(rule, values, settings)
        if found:
            reasons += found
            worst = max(worst, rule.verdict, key=VERDICTS.index)
    return Health(worst, tuple(reasons)) if reasons else _OK


_OK = Health("ok")


def _words(settings: HealthSettings) -> str:
    seconds = settings.window_s
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def _margin(value: float) -> str:
    """How far below (or, past it, over) its maximum a temperature is, in words: never "-2 °C from"."""
    if value > 0:
        return f"{value:g} °C from its maximum"
    return f"{-value:g} °C over its maximum" if value < 0 else "at its maximum"


def _reason(rule: HealthRule, values: HealthValues, settings: HealthSettings) -> list[HealthReason]:
    value = getattr(values, rule.value)
    if value is None or not rule.holds(float(value)):
        return []
    fill = {f.name: getattr(values, f.name) for f in dataclasses.fields(values)}
    text, action = rule.words(values.vendor)
    text = text.format(**fill, value=float(value), threshold=rule.threshold, window=_words(settings),
                       margin=_margin(float(value)))
    return [HealthReason(rule.code, text, action)]


def _xid_reasons(rule: HealthRule, values: HealthValues, settings: HealthSettings) -> list[HealthReason]:
    out = []
    for code, when in values.fatal_xids:
        if code not in FATAL_XIDS:
            continue
        text = rule.text.format(xid=code, xid_words=FATAL_XIDS[code],
                                xid_time=time.strftime("%H:%M:%S", time.localtime(when)))
        action = rule.action.format(xid_action=XID_ACTIONS.get(code, "reset the card"))
        out.append(HealthReason(f"xid_{code}", text, action))
    return out


def fabric_values(fabric: str | None) -> tuple[int | None, str]:
    """fabric_not_ready and its words, for a card's fabric state (None: no NVSwitch fabric)."""
    if fabric is None:
        return None, ""
    words = FABRIC_NOT_READY.get(fabric)
    return (1, words) if words else (0, "")


def worst(verdicts: Iterable[str | None]) -> str:
    """The worst of verdicts (None, unknown, counts as ok)."""
    found = set(verdicts)
    return "fail" if "fail" in found else "warn" if "warn" in found else "ok"
