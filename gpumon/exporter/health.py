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
from gpumon.exporter.fields import INT32_BLANK, Field
from gpumon.model import GpuSample

_US_PER_S = 1e6


def _counters(read: Callable[[CardCounters], float | None]) -> Callable[[GpuSample], float | None]:
    return lambda g: None if g.counters is None else read(g.counters)


def _clock_us(*reasons: str) -> Callable[[GpuSample], float | None]:
    indices = [CLOCK_EVENT_TIMES.index(r) for r in reasons]

    def read(c: CardCounters) -> float | None:
        times = c.clock_event_s
        parts = [times[i] for i in indices if times is not None and times[i] is not None]
        return sum(parts) * _US_PER_S if parts else None
    return _counters(read)


def _memory_temperature(g: GpuSample) -> float | None:
    """NVIDIA's from its health counters; AMD's and Intel's (hwmon's mem/vram sensor) from the sample."""
    if g.counters is not None and g.counters.memory_temperature is not None:
        return float(g.counters.memory_temperature)
    return None if g.temperature_memory is None else float(g.temperature_memory)


def _nvlink_kib(c: CardCounters) -> float | None:
    if c.nvlink_tx_total is None and c.nvlink_rx_total is None:
        return None
    return ((c.nvlink_tx_total or 0) + (c.nvlink_rx_total or 0)) / 1024


def _driver_energy(g: GpuSample) -> bool:
    return g.counters is not None and g.counters.energy_source == "driver"


def _counter(name: str, help: str, field: str, *, back: bool = True, blank: float | None = None,
             **how) -> Field:
    """A health counter's series: `field` a CardCounters attribute."""
    extra = {} if blank is None else {"blank": blank}
    return Field(name, help, f"counters.{field}", back=back, **extra, **how)


# Read back (fleet/prometheus/dcgm_health.py): the counters a verdict is drawn from.
HEALTH_FIELDS: list[Field] = [
    _counter("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", "memory_temperature", blank=INT32_BLANK,
             write=_memory_temperature),
    _counter("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", "energy_j",
             scale=1 / 1000, only=_driver_energy),
    _counter("gpumon_gpu_energy_joules", "Energy used: the driver's counter, or power integrated since gpumon started.",
             "energy_j", back=False),
    _counter("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", "pcie_replay_counter"),
    _counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors",
             "remapped_rows_correctable"),
    _counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors",
             "remapped_rows_uncorrectable"),
    _counter("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", "remapped_rows_failure"),
    _counter("DCGM_FI_DEV_ROW_REMAP_PENDING", "Whether remapping of rows is pending (a reset applies it)",
             "remapped_rows_pending"),
    _counter("DCGM_FI_DEV_RETIRED_SBE", "Total number of retired pages due to single-bit errors.", "retired_pages_sbe"),
    _counter("DCGM_FI_DEV_RETIRED_DBE", "Total number of retired pages due to double-bit errors.", "retired_pages_dbe"),
    _counter("DCGM_FI_DEV_RETIRED_PENDING", "Total number of pages pending retirement.", "retired_pages_pending"),
    _counter("gpumon_gpu_retired_pages_reserved",
             "Memory pages retired whatever the cause (amdgpu's bad pages reserved).", "retired_pages_reserved",
             back=False),
    _counter("gpumon_gpu_retired_pages_failed",
             "Bad memory pages the driver could not retire (amdgpu: unable to reserve).", "retired_pages_failed",
             back=False),
    _counter("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.",
             "ecc_errors_corrected"),
    _counter("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "Total number of single-bit persistent ECC errors.",
             "ecc_errors_corrected_aggregate", back=False),
    _counter("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.",
             "ecc_errors_uncorrected_aggregate", back=False),
    Field("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
          "Total number of NVLink bandwidth counters for all lanes (in KiB, TX+RX).",
          write=_counters(_nvlink_kib)),
    _counter("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "Total number of NVLink flow-control CRC errors.",
             "nvlink_crc_flit_errors", back=False),
    _counter("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "Total number of NVLink data CRC errors.",
             "nvlink_crc_data_errors", back=False),
    _counter("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "Total number of NVLink retries.",
             "nvlink_replay_errors", back=False),
    _counter("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "Total number of NVLink recovery errors.",
             "nvlink_recovery_errors", back=False),
    Field("DCGM_FI_DEV_POWER_VIOLATION", "Throttling duration due to power constraints (in us).",
          write=_clock_us("sw_power_cap", "hw_power_brake")),
    Field("DCGM_FI_DEV_THERMAL_VIOLATION", "Throttling duration due to thermal constraints (in us).",
          write=_clock_us("sw_thermal", "hw_thermal")),
    Field("DCGM_FI_DEV_SYNC_BOOST_VIOLATION", "Throttling duration due to sync-boost constraints (in us).",
          write=_clock_us("sync_boost")),
    Field("gpumon_gpu_recovery_action", "The driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): 0 none, "
          "1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain P2P and reset, 5 recover IMEX domain, 6 bus reset, "
          "7 system reboot.",
          write=_counters(lambda c: None if c.recovery_action is None else recovery_action_value(c.recovery_action))),
    # GPM's percentages as dcgm-exporter's ratios 0..1.
    _counter("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Ratio of time the graphics engine is active.", "gr_engine_active",
             scale=100, back=False),
    _counter("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned.", "sm_active",
             scale=100, back=False),
    _counter("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of number of warps resident on an SM.", "sm_occupancy",
             scale=100, back=False),
    _counter("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor (HMMA) pipe is active.", "tensor_active",
             scale=100, back=False),
    _counter("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active sending or receiving "
             "data.", "dram_active", scale=100, back=False),
]
VERDICT_VALUE = {"ok": 0.0, "warn": 1.0, "fail": 2.0}
HEALTH = "gpumon_gpu_health"
HEALTH_HELP = "The card's health verdict: 0 ok, 1 warn, 2 fail; reason: the codes of what is wrong."
# Written with its `reason` label (health_value); read back as the verdict gpumon drew on the host.
VERDICT = Field(HEALTH, HEALTH_HELP, "counters.gpumon_verdict", blank=3.0, exported=False)


def health_value(g: GpuSample) -> tuple[float, str] | None:
    """(verdict value, reason label) of a card, None when it has no verdict."""
    if g.health is None:
        return None
    return VERDICT_VALUE[g.health.verdict], ",".join(r.code for r in g.health.reasons)


