"""The cards' health in the exposition: every health counter under dcgm-exporter's name and unit, and
`gpumon_gpu_health` (0 ok, 1 warn, 2 fail, with the reasons' codes in its `reason` label).

Names and units as dcgm-exporter's counters files have them: energy in mJ since the driver loaded
(only from the driver's own counter: gpumon's integrated energy is `gpumon_gpu_energy_joules`),
throttling ("violation") times in µs, GPM's `DCGM_FI_PROF_*` as ratios 0..1. NVLink's
`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` is the data sent and received over every link, in KiB since
the driver loaded (NVML's unit; rate() gives the throughput).
"""

from __future__ import annotations

from collections.abc import Callable

from gpumon.counters import CLOCK_EVENT_TIMES, CardCounters, recovery_action_value
from gpumon.model import GpuSample

_MS_PER_J = 1000.0
_US_PER_S = 1e6


def _counter(read: Callable[[CardCounters], float | int | bool | None]) -> Callable[[GpuSample], float | None]:
    def value(g: GpuSample) -> float | None:
        if g.counters is None:
            return None
        found = read(g.counters)
        return None if found is None else float(found)
    return value


def _clock_us(*reasons: str) -> Callable[[CardCounters], float | None]:
    indices = [CLOCK_EVENT_TIMES.index(r) for r in reasons]

    def read(c: CardCounters) -> float | None:
        times = c.clock_event_s
        parts = [times[i] for i in indices if times is not None and times[i] is not None]
        return sum(parts) * _US_PER_S if parts else None
    return read


def _ratio(pct: float | None) -> float | None:
    return None if pct is None else pct / 100


def _memory_temperature(g: GpuSample) -> float | None:
    """NVIDIA's from its health counters; AMD's and Intel's (hwmon's mem/vram sensor) from the sample."""
    if g.counters is not None and g.counters.memory_temperature is not None:
        return float(g.counters.memory_temperature)
    return None if g.temperature_memory is None else float(g.temperature_memory)


def _nvlink_kib(c: CardCounters) -> float | None:
    if c.nvlink_tx_total is None and c.nvlink_rx_total is None:
        return None
    return ((c.nvlink_tx_total or 0) + (c.nvlink_rx_total or 0)) / 1024


HEALTH_GAUGES: list[tuple[str, str, Callable[[GpuSample], float | None]]] = [
    ("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", _memory_temperature),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).",
     _counter(lambda c: c.energy_j * _MS_PER_J if c.energy_j is not None and c.energy_source == "driver" else None)),
    ("gpumon_gpu_energy_joules", "Energy used: the driver's counter, or power integrated since gpumon started.",
     _counter(lambda c: c.energy_j)),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", _counter(lambda c: c.pcie_replay_counter)),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors",
     _counter(lambda c: c.remapped_rows_correctable)),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors",
     _counter(lambda c: c.remapped_rows_uncorrectable)),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed",
     _counter(lambda c: c.remapped_rows_failure)),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending (a reset applies it)",
     _counter(lambda c: c.remapped_rows_pending)),
    ("DCGM_FI_DEV_RETIRED_SBE", "Total number of retired pages due to single-bit errors.",
     _counter(lambda c: c.retired_pages_sbe)),
    ("DCGM_FI_DEV_RETIRED_DBE", "Total number of retired pages due to double-bit errors.",
     _counter(lambda c: c.retired_pages_dbe)),
    ("DCGM_FI_DEV_RETIRED_PENDING", "Total number of pages pending retirement.",
     _counter(lambda c: c.retired_pages_pending)),
    ("gpumon_gpu_retired_pages_reserved", "Memory pages retired whatever the cause (amdgpu's bad pages reserved).",
     _counter(lambda c: c.retired_pages_reserved)),
    ("gpumon_gpu_retired_pages_failed", "Bad memory pages the driver could not retire (amdgpu: unable to reserve).",
     _counter(lambda c: c.retired_pages_failed)),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.",
     _counter(lambda c: c.ecc_errors_corrected)),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors.",
     _counter(lambda c: c.ecc_errors_corrected_aggregate)),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.",
     _counter(lambda c: c.ecc_errors_uncorrected_aggregate)),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "Total number of NVLink bandwidth counters for all lanes (in KiB, TX+RX).",
     _counter(_nvlink_kib)),
    ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "Total number of NVLink flow-control CRC errors.",
     _counter(lambda c: c.nvlink_crc_flit_errors)),
    ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "Total number of NVLink data CRC errors.",
     _counter(lambda c: c.nvlink_crc_data_errors)),
    ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.",
     _counter(lambda c: c.nvlink_replay_errors)),
    ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors.",
     _counter(lambda c: c.nvlink_recovery_errors)),
    ("DCGM_FI_DEV_POWER_VIOLATION", "Throttling duration due to power constraints (in us).",
     _counter(_clock_us("sw_power_cap", "hw_power_brake"))),
    ("DCGM_FI_DEV_THERMAL_VIOLATION", "Throttling duration due to thermal constraints (in us).",
     _counter(_clock_us("sw_thermal", "hw_thermal"))),
    ("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "Throttling duration due to sync-boost constraints (in us).",
     _counter(_clock_us("sync_boost"))),
    ("gpumon_gpu_recovery_action", "The driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): 0 none, "
     "1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain P2P and reset, 5 recover IMEX domain, 6 bus reset, "
     "7 system reboot.", _counter(lambda c: None if c.recovery_action is None
                                  else recovery_action_value(c.recovery_action))),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.",
     _counter(lambda c: _ratio(c.gr_engine_active))),
    ("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.",
     _counter(lambda c: _ratio(c.sm_active))),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.",
     _counter(lambda c: _ratio(c.sm_occupancy))),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.",
     _counter(lambda c: _ratio(c.tensor_active))),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving data.",
     _counter(lambda c: _ratio(c.dram_active))),
]
VERDICT_VALUE = {"ok": 0.0, "warn": 1.0, "fail": 2.0}
HEALTH = "gpumon_gpu_health"
HEALTH_HELP = "The card's health verdict: 0 ok, 1 warn, 2 fail; reason: the codes of what is wrong."


def health_value(g: GpuSample) -> tuple[float, str] | None:
    """(verdict value, reason label) of a card, None when it has no verdict."""
    if g.health is None:
        return None
    return VERDICT_VALUE[g.health.verdict], ",".join(r.code for r in g.health.reasons)


# PromQL for the health rules, over the names above.
