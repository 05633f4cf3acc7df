"""A card's health: its reliability counters and the verdict drawn from them (shared vocabulary).

The counters change slowly and some are costly to read, so a backend reads them every few seconds
and hands the same `CardCounters` object to every sample in between: a sample costs nothing more.
In JSON each counter is a key of its own in the card (`null` where the card or driver does not say,
never 0), beside `"health": {"verdict": "ok"|"warn"|"fail", "reasons": [{"code", "text", "action"}]}`.
The rules that draw the verdict are in gpumon/health/rules.py.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

VERDICTS = ("ok", "warn", "fail")
ENERGY_SOURCES = ("driver", "integrated")
# Clock-event (throttle) reasons whose time NVML counts, by model.THROTTLE_REASONS' names.
CLOCK_EVENT_TIMES = ("sw_power_cap", "sync_boost", "sw_thermal", "hw_thermal", "hw_power_brake")
# The driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), by its NVML value: what NVIDIA's
# error-recovery guide says to do after an uncorrectable error. A value not listed here is "action_N".
RECOVERY_ACTIONS = ("none", "gpu_reset", "node_reboot", "drain_p2p", "drain_and_reset", "recover_imex_domain",
                    "bus_reset", "system_reboot")


def recovery_action_name(value: int) -> str:
    return RECOVERY_ACTIONS[value] if 0 <= value < len(RECOVERY_ACTIONS) else f"action_{value}"


def recovery_action_value(name: str) -> int | None:
    """The NVML value of a name recovery_action_name gave (None: not one of them)."""
    if name in RECOVERY_ACTIONS:
        return RECOVERY_ACTIONS.index(name)
    digits = name.removeprefix("action_")
    return int(digits) if digits != name and digits.isdigit() else None


@dataclass(frozen=True, slots=True)
class CardCounters:
    # Row remapping (Ampere and later): rows remapped so far, a remap waiting for a reset, a remap that failed.
    remapped_rows_correctable: int | None = None
    remapped_rows_uncorrectable: int | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    # Page retirement (before Ampere): pages retired for single- and double-bit errors, and pending.
    retired_pages_sbe: int | None = None
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool | None = None
    # Pages retired whatever the cause, and pages that could not be retired: amdgpu's bad pages
    # (reserved, and "unable to reserve"), which it does not sort by single or double bit.
    retired_pages_reserved: int | None = None
    retired_pages_failed: int | None = None
    # ECC errors: volatile (since the driver loaded) and aggregate (the card's lifetime). The volatile
    # uncorrected count is GpuSample.ecc_errors_uncorrected.
    ecc_errors_corrected: int | None = None
    ecc_errors_corrected_aggregate: int | None = None
    ecc_errors_uncorrected_aggregate: int | None = None
    pcie_replay_counter: int | None = None
    pcie_replay_rate: float | None = None  # replays per second over the last minute
    memory_temperature: int | None = None  # celsius (HBM)
    memory_temperature_max: int | None = None  # celsius: the memory's max operating temperature
    energy_j: float | None = None  # joules since the driver loaded ("driver") or gpumon started ("integrated")
    energy_source: str | None = None  # one of ENERGY_SOURCES
    nvlink_tx: int | None = None  # bytes/s of NVLink data, all links
    nvlink_rx: int | None = None
    nvlink_tx_total: int | None = None  # bytes since the driver loaded
    nvlink_rx_total: int | None = None
    nvlink_crc_flit_errors: int | None = None  # summed over links
    nvlink_crc_data_errors: int | None = None
    nvlink_replay_errors: int | None = None
    nvlink_recovery_errors: int | None = None
    # Seconds each clock-event reason held the clocks down since the driver loaded (CLOCK_EVENT_TIMES
    # order; None where not counted), and the share of the last minute throttled by each group.
    clock_event_s: tuple[float | None, ...] | None = None
    throttled_power_pct: float | None = None
    throttled_thermal_pct: float | None = None
    throttled_hw_slowdown_pct: float | None = None
    # What the driver asks to be done to recover the card (RECOVERY_ACTIONS; None: a driver without it).
    recovery_action: str | None = None
    # GPM (Hopper and later): percentages over the last sample interval.
    gr_engine_active: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        times = self.clock_event_s
        out["clock_event_s"] = None if times is None else dict(zip(CLOCK_EVENT_TIMES, times, strict=True))
        return out

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> CardCounters | None:
        """The counters among a card's JSON keys; None when it has none (an older gpumon, nvidia-smi)."""
        values = {name: raw[name] for name in COUNTER_KEYS if raw.get(name) is not None}
        if not values:
            return None
        times = values.get("clock_event_s")
        if times is not None:
            values["clock_event_s"] = tuple(times.get(name) for name in CLOCK_EVENT_TIMES)
        return cls(**values)


COUNTER_KEYS = tuple(f.name for f in dataclasses.fields(CardCounters))
NO_COUNTERS: dict[str, Any] = dict.fromkeys(COUNTER_KEYS)


@dataclass(frozen=True, slots=True)
class HealthReason:
    code: str  # the rule's code: "remap_pending", "xid_79", …
    text: str  # what is wrong, for people
    action: str  # what fixes it

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "text": self.text, "action": self.action}


@dataclass(frozen=True, slots=True)
class Health:
    verdict: str  # one of VERDICTS
    reasons: tuple[HealthReason, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": [r.to_dict() for r in self.reasons]}

    @classmethod
    def from_dict(cls, raw: Any) -> Health | None:
        if not isinstance(raw, dict) or raw.get("verdict") not in VERDICTS:
            return None
        reasons = tuple(HealthReason(str(r.get("code", "")), str(r.get("text", "")), str(r.get("action", "")))
                        for r in raw.get("reasons") or () if isinstance(r, dict))
        return cls(raw["verdict"], reasons)


HEALTHY = Health("ok")
