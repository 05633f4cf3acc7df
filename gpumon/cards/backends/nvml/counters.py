"""A card's reliability counters, read on its lane every `[health] interval` (health/rules.py:
30 s unless the config says otherwise), the cards in turn rather than all in one sample: row
remapping or page retirement, ECC (volatile and aggregate), PCIe replays, memory temperature and
its maximum, energy, NVLink traffic and errors, clock-event times, the driver's recovery action,
and GPM metrics on Hopper and later.

They change slowly, and some calls are costly, so between reads every sample gets the same dict
(and so the same `CardCounters`, from the health tracker). Most come in one
`nvmlDeviceGetFieldValues` call; a field the card answers NOT_SUPPORTED for is left out of the
request from then on, and a function the card or driver lacks is never called again (Card.read
remembers it). Where the driver has no energy counter (before Volta), the power readings of every
sample are integrated instead (`integrate_power`).
"""

from __future__ import annotations

import ctypes
import logging
import time
from typing import Any

import pynvml

from gpumon.cards.backends.nvml import gpm
from gpumon.cards.backends.nvml.library import Card, CardLost
from gpumon.counters import recovery_action_name

log = logging.getLogger(__name__)
MAX_NVLINKS = 18
_NS = 1e-9
_KIB = 1024

# Counter name -> NVML field id (scope 0); clock-event times in CLOCK_EVENT_TIMES' order.
_FIELDS: dict[str, int] = {
    "memory_temperature": pynvml.NVML_FI_DEV_MEMORY_TEMP,
    "ecc_errors_corrected": pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
    "ecc_errors_corrected_aggregate": pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL,
    "ecc_errors_uncorrected_aggregate": pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL,
    "nvlink_crc_flit_errors": pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
    "nvlink_crc_data_errors": pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    "nvlink_replay_errors": pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
    "nvlink_recovery_errors": pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    "clock_sw_power_cap": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
    "clock_sync_boost": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
    "clock_sw_thermal": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
    "clock_hw_thermal": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
    "clock_hw_power_brake": pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN,
    # What the driver asks to be done after an uncorrectable error (drivers from 2024 on; older
    # ones answer NOT_SUPPORTED or INVALID_ARGUMENT for it: left out of the request from then on).
    "recovery_action": getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230),
}
_CLOCKS = ("clock_sw_power_cap", "clock_sync_boost", "clock_sw_thermal", "clock_hw_thermal", "clock_hw_power_brake")
_VALUE = {  # valueType -> the union's member
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


class _Value(ctypes.Union):
    _fields_ = [("dVal", ctypes.c_double), ("uiVal", ctypes.c_uint), ("ulVal", ctypes.c_ulong),
                ("ullVal", ctypes.c_ulonglong), ("sllVal", ctypes.c_longlong), ("siVal", ctypes.c_int),
                ("usVal", ctypes.c_ushort)]


class _FieldValue(ctypes.Structure):
    """nvmlFieldValue_t, laid out as the bindings' c_nvmlFieldValue_t. Declared here because the
    bindings' structures run Python code on every attribute read: a read of 21 fields cost 110 µs
    through them, every few seconds per card."""

    _fields_ = [("fieldId", ctypes.c_uint32), ("scopeId", ctypes.c_uint32), ("timestamp", ctypes.c_int64),
                ("latencyUsec", ctypes.c_int64), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", _Value)]


assert ctypes.sizeof(_FieldValue) == ctypes.sizeof(pynvml.c_nvmlFieldValue_t)


def read_counters(card: Card, interval: float) -> dict[str, Any]:
    """The card's counters (CardCounters' fields, for HealthTracker.card): read again when the
    `interval` ([health] interval, seconds) has passed, else the same dict as last time."""
    now = time.monotonic()
    if card.counters is not None and now - card.counters_read_at < interval:
        return card.counters
    # The first read is at once (a one-off snapshot has them); after it the cards take turns.
    card.counters_read_at = now if card.counters is not None else now - interval * (card.index % 10) / 10
    fields = _field_values(card)
    remap = card.read("remap", pynvml.nvmlDeviceGetRemappedRows)
    retired = _retired_pages(card) if remap is None else (None, None, None)
    energy = card.read("energy", pynvml.nvmlDeviceGetTotalEnergyConsumption)
    if card.memory_temperature_max is None and "mem_max" not in card.skip:  # never changes: asked once
        card.memory_temperature_max = card.read("mem_max", pynvml.nvmlDeviceGetTemperatureThreshold,
                                                pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX)
    clocks = tuple(None if (ns := fields.get(name)) is None else round(ns * _NS, 3) for name in _CLOCKS)
    tx, rx = fields.get("nvlink_tx"), fields.get("nvlink_rx")
    card.counters = dict(
        remapped_rows_correctable=remap[0] if remap else None,
        remapped_rows_uncorrectable=remap[1] if remap else None,
        remapped_rows_pending=bool(remap[2]) if remap else None,
        remapped_rows_failure=bool(remap[3]) if remap else None,
        retired_pages_sbe=retired[0], retired_pages_dbe=retired[1], retired_pages_pending=retired[2],
        ecc_errors_corrected=fields.get("ecc_errors_corrected"),
        ecc_errors_corrected_aggregate=fields.get("ecc_errors_corrected_aggregate"),
        ecc_errors_uncorrected_aggregate=fields.get("ecc_errors_uncorrected_aggregate"),
        pcie_replay_counter=card.read("pcie_replay", pynvml.nvmlDeviceGetPcieReplayCounter),
        memory_temperature=fields.get("memory_temperature"),
        memory_temperature_max=card.memory_temperature_max or None,
        energy_j=energy / 1000 if energy is not None else card.energy_integrated,
        energy_source="driver" if energy is not None else "integrated" if card.energy_integrated is not None else None,
        nvlink_tx_total=None if tx is None else tx * _KIB, nvlink_rx_total=None if rx is None else rx * _KIB,
        nvlink_crc_flit_errors=fields.get("nvlink_crc_flit_errors"),
        nvlink_crc_data_errors=fields.get("nvlink_crc_data_errors"),
        nvlink_replay_errors=fields.get("nvlink_replay_errors"),
        nvlink_recovery_errors=fields.get("nvlink_recovery_errors"),
        clock_event_s=None if all(c is None for c in clocks) else clocks,
        recovery_action=None if (action := fields.get("recovery_action")) is None else recovery_action_name(action),
        **gpm.metrics(card),
    )
    return card.counters


def integrate_power(card: Card, watts: float | None) -> None:
    """Add this sample's energy (power × time since the last sample) where the driver has no energy
    counter; called every sample, it costs nothing once the counter is known to be there."""
    if "energy" not in card.skip:
        return
    now = time.monotonic()
    if watts is not None and card.power_at is not None:
        card.energy_integrated = (card.energy_integrated or 0.0) + (watts + card.power_w) / 2 * (now - card.power_at)
    card.power_at, card.power_w = (now, watts) if watts is not None else (None, 0.0)


def _field_values(card: Card) -> dict[str, Any]:
    """Every field still asked for, in one call; NVLink traffic summed over the active links."""
    if card.fields is None:
        wanted = [(name, fid, 0) for name, fid in _FIELDS.items()]
        for link in _active_links(card):
            wanted += [("nvlink_tx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, link),
                       ("nvlink_rx", pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, link)]
        card.fields = _request(wanted)
    names, request = card.fields
    if not names or "fields" in card.skip:
        return {}
    if card.read("fields", _get_field_values, request) is None:
        return {}
    out: dict[str, Any] = {}
    dropped = []
    for i, name in enumerate(names):
        answer = request[i]
        code = answer.nvmlReturn
        if code == pynvml.NVML_SUCCESS:
            value = getattr(answer.value, _VALUE.get(answer.valueType, "ullVal"))
            out[name] = out.get(name, 0) + value if name in ("nvlink_tx", "nvlink_rx") else value
        elif code == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise CardLost(str(pynvml.NVMLError(code)))
        elif code in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_NO_PERMISSION,
                      pynvml.NVML_ERROR_INVALID_ARGUMENT):
            log.info("NVML: card %d: field %s unavailable (%s)", card.index, name, pynvml.NVMLError(code))
            dropped.append(i)
    if dropped:  # never asked again
        card.fields = _request([(names[i], request[i].fieldId, request[i].scopeId)
                                for i in range(len(names)) if i not in dropped])
    return out


def _request(wanted: list[tuple[str, int, int]]) -> tuple[list[str], Any]:
    """(names, the nvmlFieldValue_t array asking for them), made once and reused."""
    request = (_FieldValue * len(wanted))()
    for i, (_, field, scope) in enumerate(wanted):
        request[i].fieldId, request[i].scopeId = field, scope
    return [name for name, _, _ in wanted], request


def _get_field_values(handle: Any, request: Any) -> Any:
    fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetFieldValues")
    pynvml._nvmlCheckReturn(fn(handle, ctypes.c_int32(len(request)), request))
    return request


def _active_links(card: Card) -> list[int]:
    links = []
    for link in range(MAX_NVLINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(card.handle, link):
                links.append(link)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise CardLost(str(exc)) from None
            break  # NOT_SUPPORTED: no NVLink; INVALID_ARGUMENT: past the card's last link
    return links


def _retired_pages(card: Card) -> tuple[int | None, int | None, bool | None]:
    """Pages retired for single-bit and double-bit errors, and whether some wait for a reset
    (page retirement: the cards before row remapping)."""
    sbe, dbe = card.read_versioned("retired_sbe"), card.read_versioned("retired_dbe")
    pending = card.read("retired_pending", pynvml.nvmlDeviceGetRetiredPagesPendingStatus)
    return (None if sbe is None else len(sbe), None if dbe is None else len(dbe),
            None if pending is None else bool(pending))
