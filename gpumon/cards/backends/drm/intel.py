"""An Intel card's sysfs files, i915 and xe (their sysfs ABI documents; hwmon: sysfs-driver-intel-*-hwmon).

- Frequency: i915 `gt/gt0/rps_act_freq_mhz` (the clock now; `rps_cur_freq_mhz` is what was asked
  for), or the older `gt_act_freq_mhz`/`gt_cur_freq_mhz` on the card; xe `device/tile0/gt0/freq0/act_freq`
  (`cur_freq`). The maximum beside each.
- Power: the card's hwmon energy counter, made into watts by the backend from two samples (i915 and
  xe have no instantaneous power file); its limit `power1_max` (the "card" channel on xe).
- VRAM: xe gives each tile's size (`device/tile*/physical_vram_size_bytes`); i915 only with the
  out-of-tree backports (`lmem_total_bytes`, `lmem_avail_bytes`). How much is in use the kernel does
  not say for the whole card (only per client, in fdinfo), so that stays None.
- Utilisation has no sysfs file: the backend adds up the clients' engine time from fdinfo.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpumon.cards.backends.drm.hwmon import Hwmon, read_hwmon
from gpumon.cards.backends.drm.sysfs import CardNode, read_int


@dataclass(frozen=True, slots=True)
class IntelValues:
    clock_mhz: int | None
    clock_max_mhz: int | None
    vram_total: int | None
    vram_free: int | None
    energy_uj: int | None
    power_cap_w: float | None
    temperature: int | None
    temperature_memory: int | None
    fan_percent: int | None


def _first(*paths: str) -> int | None:
    for path in paths:
        value = read_int(path)
        if value is not None:
            return value
    return None


def _tiles(device: str) -> list[str]:
    try:
        return sorted(os.path.join(device, t) for t in os.listdir(device) if t.startswith("tile") and t[4:].isdigit())
    except OSError:
        return []


def read_values(card: CardNode, hwmon: Hwmon | None) -> IntelValues:
    if card.driver == "xe":
        freq = os.path.join(card.device, "tile0", "gt0", "freq0")
        clock = _first(os.path.join(freq, "act_freq"), os.path.join(freq, "cur_freq"))
        clock_max = read_int(os.path.join(freq, "max_freq"))
        sizes = [read_int(os.path.join(tile, "physical_vram_size_bytes")) for tile in _tiles(card.device)]
        known = [s for s in sizes if s is not None]
        vram_total, vram_free = (sum(known) if known else None), None
    else:
        gt = os.path.join(card.path, "gt", "gt0")
        clock = _first(os.path.join(gt, "rps_act_freq_mhz"), os.path.join(gt, "rps_cur_freq_mhz"),
                       os.path.join(card.path, "gt_act_freq_mhz"), os.path.join(card.path, "gt_cur_freq_mhz"))
        clock_max = _first(os.path.join(gt, "rps_max_freq_mhz"), os.path.join(card.path, "gt_max_freq_mhz"))
        vram_total = read_int(os.path.join(card.path, "lmem_total_bytes"))
        vram_free = read_int(os.path.join(card.path, "lmem_avail_bytes"))
    sensors = read_hwmon(hwmon) if hwmon is not None else None
    temps = sensors.temps if sensors else {}
    return IntelValues(
        clock_mhz=clock, clock_max_mhz=clock_max, vram_total=vram_total or None, vram_free=vram_free,
        energy_uj=sensors.energy_uj if sensors else None, power_cap_w=sensors.power_cap_w if sensors else None,
        temperature=temps.get("pkg", temps.get("card", temps.get("temp1"))), temperature_memory=temps.get("vram"),
        fan_percent=sensors.fan_percent if sensors else None,
    )
