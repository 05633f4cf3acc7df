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
    [health.xid]              # which XIDs count (health/xid.py); failover reads the same policy
    add_fatal = [31]
    remove_fatal = [92]
    warn = [13]
    [[health.xid.threshold]]  # XID 43 three times within 10 minutes fails the card
    code = 43
    count = 3
    within = "10m"
    verdict = "fail"

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

from gpumon.config import Config
from gpumon.counters import VERDICTS, Health, HealthReason
from gpumon.errors import UsageError
from gpumon.health import xid as catalogue
from gpumon.health.driver_events import event_reasons
from gpumon.units import format_time, parse_duration
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
    HealthRule("recovery_action", "recovery_action_needed", "==", 1, "fail",
               "the driver's recovery action is {recovery_action}", "{recovery_action_words}",
               "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; NVIDIA GPU memory error recovery guide"),
    HealthRule("xid", "fatal_xid", "==", 1, "fail", "XID {xid} ({xid_words}) at {xid_time}",
               "{xid_action}", "NVIDIA XID catalogue (docs.nvidia.com/deploy/xid-errors)"),
    # XIDs the site's [health.xid] names as warnings, or that passed one of its thresholds: the
    # verdict is the policy's (a threshold says warn or fail), this rule's only when it is "off".
    HealthRule("xid_policy", "policy_xid", "==", 1, "warn", "XID {xid} ({xid_words}) at {xid_time}",
               "{xid_action}", "the site's [health.xid]; NVIDIA XID catalogue"),
    # The driver's other health events within the window (health/driver_events.py): each its own verdict.
    HealthRule("driver_event", "driver_event", "==", 1, "fail", "", "",
               "NVML events (nvmlEventType*): ECC storms, DRAM retirement, poison, GPU unavailable, recovery"),
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
    xids: tuple[tuple[int, float], ...] = ()  # (code, unix time) the policy counts, newest first
    events: tuple[tuple[str, int, float], ...] = ()  # the driver's other health events: (name, data, unix time)
    retired_pages_failed: int | None = None
    no_counters: int | None = None  # 1: the backend could read none of the card's counters
    no_counters_words: str = ""  # why not
    vendor: str = DEFAULT_VENDOR  # whose words the reasons use (the vendor's record: health_words)
    now: float | None = None  # unix time of the sample (the XIDs' windows count from it)
    recovery_action_needed: int | None = None  # 1: the driver's recovery action is not "none"
    recovery_action: str = ""
    recovery_action_words: str = ""  # exactly what the driver asks, in words


@dataclass(frozen=True)
class HealthSettings:
    """The config's [health] (parse_settings), handed to every tracker and backend that draws verdicts."""

    rules: tuple[HealthRule, ...] = RULES
    window_s: float = DEFAULT_WINDOW_S
    interval_s: float = DEFAULT_INTERVAL_S  # how often a backend reads the counters
    xid: catalogue.XidPolicy = catalogue.XidPolicy()


def configured_settings(config: Config) -> HealthSettings:
    """The config's [health]; its errors name the file that set it."""
    source = next((file for key, (file, _) in config.origins.items() if key.startswith("health")), config.path)
    return parse_settings(config.health, f"config {source}" if source else "config")


def parse_settings(table: Mapping[str, Any], where: str = "config") -> HealthSettings:
    """The config's [health] table as settings (empty: the defaults); UsageError names the bad key."""
    known = {rule.code: rule for rule in RULES}
    for key in table:
        if key not in ("window", "interval", "rules", "xid", "xid_state"):  # xid_state: cli/health.py's
            raise UsageError(f"{where}: unknown key 'health.{key}' (known: window, interval, rules, xid, xid_state)")
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
    policy = table.get("xid", {})
    if not isinstance(policy, Mapping):
        raise UsageError(f"{where}: [health.xid] must be a table")
    return HealthSettings(tuple(rules.values()), durations["window"], durations["interval"],
                          catalogue.parse_policy(policy, where))


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


def assess(values: HealthValues, settings: HealthSettings = HealthSettings()) -> Health:
    """The verdict: the worst of the rules that hold, each with its reason and action."""
    reasons: list[HealthReason] = []
    worst = "ok"
    for rule in settings.rules:
        if rule.verdict == "off":
            continue
        if rule.value in ("fatal_xid", "policy_xid"):
            for reason, verdict in _xid_reasons(rule, values, settings):
                reasons.append(reason)
                worst = max(worst, verdict, key=VERDICTS.index)
            continue
        if rule.value == "driver_event":
            now = values.now if values.now is not None else time.time()
            for reason, verdict in event_reasons(values.events, now, settings.window_s, RECOVERY_WORDS):
                reasons.append(reason)
                worst = max(worst, verdict if rule.verdict == "fail" else rule.verdict, key=VERDICTS.index)
            continue
        found = _reason(rule, values, settings)
        if found:
            reasons += found
            worst = max(worst, rule.verdict, key=VERDICTS.index)
    return Health(worst, tuple(reasons)) if reasons else _OK


_OK = Health("ok")


def _words(settings: HealthSettings) -> str:
    return _span(settings.window_s)


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
    return [HealthReason(rule.code, text, _fill(action, **fill))]


def _xid_reasons(rule: HealthRule, values: HealthValues,
                 settings: HealthSettings) -> list[tuple[HealthReason, str]]:
    """The `xid` rule: each fatal XID within the window (fail, or the rule's verdict if changed);
    `xid_policy`: the policy's warning codes and thresholds (their own verdicts)."""
    out = []
    now = values.now if values.now is not None else time.time()
    for found in settings.xid.judge(values.xids, now, settings.window_s):
        fatal = found.verdict == "fail" and found.count == 1
        if fatal != (rule.value == "fatal_xid"):
            continue
        text = _fill(rule.text, xid=found.code, xid_words=catalogue.words(found.code),
                     xid_time=format_time(found.when, now=now, seconds=True))
        code = f"xid_{found.code}"
        if found.within_s:
            text += f": {found.count} times within {_span(found.within_s)}"
            code += "_repeated"
        action = _fill(rule.action, xid_action=catalogue.action(found.code))
        policy_verdict = "ok" if rule.verdict == "ok" else found.verdict  # "ok": the site made them notes
        out.append((HealthReason(code, text, action), rule.verdict if fatal else policy_verdict))
    return out


def _fill(template: str, **values: Any) -> str:
    """A rule's text with its values; a site's own text that is not a template is kept as written."""
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError):
        return template


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


# What NVIDIA's error-recovery guide says each recovery action asks of the operator.
RECOVERY_WORDS = {
    "gpu_reset": "the driver asks for a GPU reset: stop every program on the card, then reset it (nvidia-smi -r)",
    "node_reboot": "the driver asks for a node reboot: the fault may have left the OS inconsistent; drain the "
                   "node and reboot it (a GPU reset is not enough)",
    "drain_p2p": "the driver asks to drain peer-to-peer work: stop the jobs using P2P/NVLink with this card, "
                 "then it can take work again",
    "drain_and_reset": "the driver asks to drain peer-to-peer work and reset the card: stop its jobs and those "
                       "using P2P with it, then reset it (nvidia-smi -r)",
    "recover_imex_domain": "the driver asks to recover the IMEX domain: restart the IMEX daemon of the NVLink domain",
    "bus_reset": "the driver asks for a reset of the card's PCIe bus: stop its programs, then reset the bus",
    "system_reboot": "the driver asks for a system reboot: drain the node and reboot it",
}


def recovery_values(action: str | None) -> tuple[int | None, str]:
    """recovery_action_needed and what the driver asks, for a card's recovery action (None: not read)."""
    if action is None:
        return None, ""
    if action == "none":
        return 0, ""
    return 1, RECOVERY_WORDS.get(action, f"the driver asks for recovery action {action}: see NVIDIA's "
                                         "error-recovery guide for this driver")


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
