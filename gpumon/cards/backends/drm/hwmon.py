"""A card's hwmon directory (Documentation/hwmon/sysfs-interface, amdgpu/thermal.rst, the i915
and xe hwmon ABI): temperatures, power, energy, fan and, on amdgpu, clocks.

Which files a card has, and their labels, never change while it is bound, so they are found once
(`find_hwmon`); a sample then reads only the values (`read_hwmon`). Units as the kernel gives
them: millidegrees, microwatts, microjoules, hertz, RPM; turned here into °C, W, µJ, MHz, %.

The card's power is its own channel: the one labelled "card" where channels are labelled (xe has
"card" and "pkg"; the package is not the card), else channel 1 (amdgpu's PPT, i915's only one).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpumon.cards.backends.drm.sysfs import read_int, read_text

_FILE = re.compile(r"(temp|power|energy|fan|pwm|freq)(\d+)_?(.*)")


@dataclass(frozen=True, slots=True)
class Hwmon:
    """Which value files a card's hwmon directory has."""

    path: str
    temps: dict[str, str]  # label ("edge", "junction", "mem", "pkg"; "temp1" unlabelled) -> file
    power: str | None  # the card's power now (µW): powerN_average, else powerN_input
    power_cap: str | None  # its limit (µW): powerN_cap (amdgpu), else powerN_max (i915, xe)
    energy: str | None  # the card's energy counter (µJ)
    fan_rpm: str | None
    pwm: str | None
    pwm_max: int | None  # pwm's full scale (amdgpu: pwm1_max, else 255)
    freqs: dict[str, str]  # label ("sclk", "mclk") -> file (Hz)


def _channel(files: dict[tuple[str, int], set[str]], path: str, kind: str) -> int | None:
    """The card's channel of `kind` (power, energy): labelled "card", else the first."""
    channels = sorted(n for k, n in files if k == kind)
    for n in channels:
        if "label" in files[kind, n] and (read_text(os.path.join(path, f"{kind}{n}_label")) or "").lower() == "card":
            return n
    return channels[0] if channels else None


def find_hwmon(device: str) -> Hwmon | None:
    """The hwmon directory under a PCI device, or None when the driver made none (an integrated
    Intel card: its power is the CPU package's, which is not the card's)."""
    base = os.path.join(device, "hwmon")
    try:
        path = os.path.join(base, sorted(os.listdir(base))[0])
        names = os.listdir(path)
    except (OSError, IndexError):
        return None
    files: dict[tuple[str, int], set[str]] = {}
    for name in names:
        if match := _FILE.fullmatch(name):
            files.setdefault((match.group(1), int(match.group(2))), set()).add(match.group(3))

    def labelled(kind: str, suffix: str) -> dict[str, str]:
        found = {}
        for (k, n), suffixes in sorted(files.items()):
            if k == kind and suffix in suffixes:
                label = read_text(os.path.join(path, f"{k}{n}_label")) if "label" in suffixes else None
                found[(label or f"{k}{n}").lower()] = os.path.join(path, f"{k}{n}_{suffix}")
        return found

    def file(kind: str, n: int | None, *suffixes: str) -> str | None:
        have = files.get((kind, n), set()) if n is not None else set()
        return next((os.path.join(path, f"{kind}{n}_{s}") for s in suffixes if s in have), None)

    power, energy = _channel(files, path, "power"), _channel(files, path, "energy")
    pwm = os.path.join(path, "pwm1") if ("pwm", 1) in files and "" in files["pwm", 1] else None
    return Hwmon(path=path, temps=labelled("temp", "input"), power=file("power", power, "average", "input"),
                 power_cap=file("power", power, "cap", "max"), energy=file("energy", energy, "input"),
                 fan_rpm=file("fan", 1, "input"), pwm=pwm,
                 pwm_max=(read_int(os.path.join(path, "pwm1_max")) or 255) if pwm else None,
                 freqs=labelled("freq", "input"))


@dataclass(frozen=True, slots=True)
class HwmonReading:
    temps: dict[str, int]  # label -> °C
    power_w: float | None
    power_cap_w: float | None
    energy_uj: int | None
    fan_percent: int | None
    fan_rpm: int | None
    freqs_mhz: dict[str, int]


def _micro(path: str | None) -> float | None:
    value = read_int(path) if path else None
    return None if value is None else value / 1e6


def read_hwmon(hwmon: Hwmon) -> HwmonReading:
    temps = {}
    for label, path in hwmon.temps.items():
        milli = read_int(path)
        if milli is not None:
            temps[label] = round(milli / 1000)
    pwm = read_int(hwmon.pwm) if hwmon.pwm else None
    fan = None if pwm is None or not hwmon.pwm_max else round(100 * pwm / hwmon.pwm_max)
    freqs = {label: hz // 1_000_000 for label, path in hwmon.freqs.items() if (hz := read_int(path)) is not None}
    cap = _micro(hwmon.power_cap)
    return HwmonReading(temps=temps, power_w=_micro(hwmon.power), power_cap_w=cap or None,
                        energy_uj=read_int(hwmon.energy) if hwmon.energy else None, fan_percent=fan,
                        fan_rpm=read_int(hwmon.fan_rpm) if hwmon.fan_rpm else None, freqs_mhz=freqs)
