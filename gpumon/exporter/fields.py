"""What a series is, written once: its name and help, the snapshot field it carries, and the scale
between the two, so that one table entry both writes the series (exporter/collector.py) and reads
it back into a snapshot (fleet/prometheus/dcgm.py), as dcgm-exporter's counters CSV drives what
it collects and how it names it.

`CARD_FIELDS` are a card's readings under dcgm-exporter's names (`DCGM_FI_DEV_*`, framebuffer
sizes in whole MiB as DCGM gives them: NVML's bytes divided by 2^20, the remainder dropped; PCIe in
KB/s) and gpumon's own (`gpumon_*`); exporter/health.py has the health counters' table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpumon.model import THROTTLE_REASONS, GpuSample

XID_COUNT_WINDOW_S = 300.0  # as dcgm-exporter's default --xid-count-window-size (300000 ms)

MIB = 1 << 20
THROTTLE_BITS = {name: bit for bit, name in THROTTLE_REASONS.items()}

# DCGM's "blank" values (dcgm_structs.h) are no reading: the blank itself and the codes just above
# it (+1 not found, +2 not supported, +3 not permissioned). dcgm-exporter prints them as numbers
# (9223372036854775794 for a card without memory temperature); Prometheus holds them as float64,
# which rounds the INT64 ones to 2**63. So a value from its field type's blank up is no reading.
# A 32-bit reading (NVML's unsigned int: temperatures, clocks, utilisation...) blank-checks
# against DCGM_INT32_BLANK, the value DCGM converts its blanks to for 32-bit quantities.
INT32_BLANK = float(0x7FFFFFF0)
INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)
FP64_BLANK = 140737488355328.0  # 2**47


@dataclass(frozen=True)
class Field:
    """One series: exported value = the snapshot's `field` / `scale` (how many of the snapshot's
    units one exported unit is: MIB for MiB, 1/1000 for mJ of a field in J), and read back as
    value * scale. `field` names a GpuSample attribute, or `counters.NAME` one of its CardCounters."""

    name: str
    help: str
    field: str | None = None  # None: exported only, never read back (a value worked out, not a field)
    scale: float = 1.0
    blank: float = INT64_BLANK  # read back: from DCGM's blank of the field's type up, no reading
    whole: bool = False  # exported as a whole number of its unit, the remainder dropped (DCGM's MiB)
    write: Callable[[GpuSample], float | None] | None = None  # where the exported value is worked out
    only: Callable[[GpuSample], bool] | None = None  # written only for cards where this holds
    exported: bool = True  # False: another exporter's name, only read back
    back: bool = True  # False: written, not read back into a snapshot

    @property
    def key(self) -> str:
        """The name a reading is kept under when read back (the attribute's)."""
        return (self.field or self.name).rpartition(".")[2]

    @property
    def reads_back(self) -> bool:
        """Whether a reader takes it into a snapshot (a value worked out from no one field never is)."""
        return self.back and self.field is not None

    @property
    def counter(self) -> bool:
        return (self.field or "").startswith("counters.")

    def value(self, g: GpuSample) -> float | None:
        """The exported value of a card, None where it has none."""
        if self.only is not None and not self.only(g):
            return None
        if self.write is not None:
            return self.write(g)
        raw = getattr(g.counters, self.key, None) if self.counter else getattr(g, self.key)
        if raw is None:
            return None
        # Divided by a scale of 1 or more, multiplied by the inverse of a smaller one: each exact
        # where the scale is (57 / 100 is 0.57; 57 * 0.01 is not).
        value = float(raw) / self.scale if self.scale >= 1 else float(raw) * (1 / self.scale)
        return float(math.floor(value)) if self.whole else value

    def reading(self, exported: float) -> float:
        """An exported value read back, in the snapshot's unit."""
        return exported * self.scale


def read_back(fields: list[Field]) -> dict[str, tuple[str, float, float]]:
    """Metric -> (the key it is kept under, scale to the snapshot's unit, blank): what a reader takes."""
    return {f.name: (f.key, f.scale, f.blank) for f in fields if f.reads_back}


def _reserved_mib(g: GpuSample) -> float | None:
    """What the driver keeps for itself: with used and free, a reader adds up the card's total."""
    if g.memory_total is None or g.memory_used is None or g.memory_free is None:
        return None
    return float(max(0, g.memory_total - g.memory_used - g.memory_free) // MIB)


def _throttle_mask(g: GpuSample) -> float | None:
    return None if g.throttle_reasons is None else float(sum(THROTTLE_BITS[r] for r in g.throttle_reasons))


# A card's readings, in the exposition's order. Read back, the throttle bitmask becomes the
# reasons' names and the pstate its "P" name (fleet/prometheus/dcgm.py).
CARD_FIELDS: list[Field] = [
    Field("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "utilization_gpu", blank=INT32_BLANK),
    Field("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "utilization_memory", blank=INT32_BLANK),
    Field("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used", MIB, whole=True),
    Field("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "memory_free", MIB, whole=True),
    # Not a snapshot field: it counts towards the total a reader makes of used + free + reserved.
    Field("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", "memory_reserved", MIB,
          write=_reserved_mib),
    Field("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature", blank=INT32_BLANK),
    Field("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", "fan", blank=INT32_BLANK),
    Field("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_draw", blank=FP64_BLANK),
    Field("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", "power_limit", blank=FP64_BLANK),
    Field("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "clock_sm", blank=INT32_BLANK),
    Field("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "clock_mem", blank=INT32_BLANK),
    Field("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", "encoder_util", blank=INT32_BLANK),
    Field("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", "decoder_util", blank=INT32_BLANK),
    Field("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of uncorrectable (double-bit) volatile ECC errors.",
          "ecc_errors_uncorrected"),
    Field("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe TX throughput (in KB/s).", "pcie_tx", 1024, INT32_BLANK),
    Field("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe RX throughput (in KB/s).", "pcie_rx", 1024, INT32_BLANK),
    Field("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask).", "throttle_reasons",
          write=_throttle_mask),
    Field("gpumon_gpu_processes", "Processes using the GPU.",
          write=lambda g: None if g.state != "ok" else len(g.processes)),
    # dcgm-exporter's, read back only: the performance state, and the bitmask's name since DCGM 3.3.
    Field("DCGM_FI_DEV_PSTATE", "Performance state.", "pstate", blank=INT32_BLANK, exported=False),
    Field("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "Current clock event reasons (bitmask).", "throttle_reasons",
          exported=False),
]
# Every card has it, lost ones too (the other readings are only of cards that answer).
LOST = Field("gpumon_gpu_lost", "1 when the card has fallen off the bus.", "lost", blank=2.0,
             write=lambda g: 1.0 if g.state == "lost" else 0.0)
