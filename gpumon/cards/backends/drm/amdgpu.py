"""An amdgpu card's sysfs files (Documentation/gpu/amdgpu/driver-misc.rst and thermal.rst).

`read_identity` reads what does not change (unique id, VBIOS, board name, serial); `read_values`
what does, once per sample. Neither is called for a card whose runtime PM status is "suspended":
most of these files wake the card to answer (older kernels), or fail (newer ones).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpumon.cards.backends.drm.hwmon import Hwmon, read_hwmon
from gpumon.cards.backends.drm.sysfs import read_int, read_text

_LEVEL = re.compile(r"\s*\d+:\s*(\d+)\s*[MmGg]hz\s*\*")  # "1: 1800Mhz *": the level in use


@dataclass(frozen=True, slots=True)
class AmdIdentity:
    uuid: str | None  # ROCm's form of unique_id: "GPU-" + 16 hex digits
    vbios: str | None
    product_name: str | None  # the board's FRU name (Instinct and some Radeon Pro boards only)
    serial: str | None
    xgmi_hive: str | None  # cards of one xGMI hive share this id


def _nonzero_hex(text: str | None) -> str | None:
    if not text:
        return None
    try:
        return None if int(text, 16) == 0 else text.lower()
    except ValueError:
        return None


def read_identity(device: str) -> AmdIdentity:
    unique = _nonzero_hex(read_text(os.path.join(device, "unique_id")))
    hive = _nonzero_hex(read_text(os.path.join(device, "xgmi_hive_info", "xgmi_hive_id")))
    return AmdIdentity(
        # ROCm (rocminfo, ROCR_VISIBLE_DEVICES) names the card "GPU-" and the 16 hex digits of the
        # same unique id (KFD's topology reads it from amdgpu).
        uuid=f"GPU-{int(unique, 16):016x}" if unique else None,
        vbios=read_text(os.path.join(device, "vbios_version")) or None,
        product_name=read_text(os.path.join(device, "product_name")) or None,
        serial=read_text(os.path.join(device, "serial_number")) or None,
        xgmi_hive=hive,
    )


@dataclass(frozen=True, slots=True)
class AmdValues:
    busy_percent: int | None
    memory_busy_percent: int | None
    vram_total: int | None
    vram_used: int | None
    gtt_total: int | None
    gtt_used: int | None
    sclk_mhz: int | None
    mclk_mhz: int | None
    perf_level: str | None
    temperature: int | None  # edge
    temperature_junction: int | None
    temperature_memory: int | None
    power_w: float | None
    power_cap_w: float | None
    fan_percent: int | None


def dpm_level(device: str, name: str) -> int | None:
    """The clock level marked `*` in pp_dpm_sclk / pp_dpm_mclk, in MHz."""
    for line in (read_text(os.path.join(device, name)) or "").splitlines():
        if match := _LEVEL.match(line):
            return int(match.group(1))
    return None


def _percent(path: str) -> int | None:
    value = read_int(path)
    return value if value is not None and 0 <= value <= 100 else None


def read_values(device: str, hwmon: Hwmon | None) -> AmdValues:
    def size(name: str) -> int | None:
        return read_int(os.path.join(device, name))

    sensors = read_hwmon(hwmon) if hwmon is not None else None
    temps = sensors.temps if sensors else {}
    freqs = sensors.freqs_mhz if sensors else {}
    # hwmon's freq1/freq2 are the clocks now; pp_dpm_* only says which level is chosen.
    sclk = freqs.get("sclk")
    mclk = freqs.get("mclk")
    return AmdValues(
        busy_percent=_percent(os.path.join(device, "gpu_busy_percent")),
        memory_busy_percent=_percent(os.path.join(device, "mem_busy_percent")),
        vram_total=size("mem_info_vram_total"), vram_used=size("mem_info_vram_used"),
        gtt_total=size("mem_info_gtt_total"), gtt_used=size("mem_info_gtt_used"),
        sclk_mhz=sclk if sclk is not None else dpm_level(device, "pp_dpm_sclk"),
        mclk_mhz=mclk if mclk is not None else dpm_level(device, "pp_dpm_mclk"),
        perf_level=read_text(os.path.join(device, "power_dpm_force_performance_level")) or None,
        temperature=temps.get("edge", temps.get("temp1")),
        temperature_junction=temps.get("junction"), temperature_memory=temps.get("mem"),
        power_w=sensors.power_w if sensors else None, power_cap_w=sensors.power_cap_w if sensors else None,
        fan_percent=sensors.fan_percent if sensors else None,
    )
