"""Parsing and formatting of sizes, durations, times and CPU lists: the units users type and read."""

from __future__ import annotations

import datetime as dt
import re
import time

from gpumon.errors import UsageError

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?B?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}
# Every duration gpumon reads (options, config keys, rules) goes through this one grammar. `min`
# and upper case were accepted by `report --since` and `[history] keep`, so they still are.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|min|m|h|d|w)\s*$", re.IGNORECASE)
_DURATION_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
DURATION_EXAMPLES = "500ms, 30s, 10m, 2h, 2d or 1w"


def parse_size(text: str, total: int | None = None) -> int:
    """'8G', '8GiB', '512M', '1024' (bytes) or '50%' of `total` -> bytes.

    Binary units throughout, as nvidia-smi and the frameworks use them: 1G = 1 GiB.
    """
    text = text.strip()
    if text.endswith("%"):
        try:
            pct = float(text[:-1])
        except ValueError:
            raise UsageError(f"bad size {text!r}: expected e.g. 8G, 512M or 50%") from None
        if not 0 < pct <= 100:
            raise UsageError(f"bad size {text!r}: a percentage must be in (0, 100]")
        if total is None:
            raise UsageError(f"size {text!r} is relative, but the card's total memory is unknown")
        return int(total * pct / 100)
    match = _SIZE.match(text)
    if text.startswith("-"):
        raise UsageError(f"bad size {text!r}: a size cannot be negative (expected e.g. 8G, 512M or 50%)")
    if not match:
        raise UsageError(f"bad size {text!r}: expected e.g. 8G, 8GiB, 512M or 50%")
    number, prefix, _ = match.groups()
    size = int(float(number) * 1024 ** _POWERS[prefix.upper()])
    if size <= 0:
        raise UsageError(f"bad size {text!r}: must be more than zero")
    return size


def parse_duration(text: str, what: str = "duration", above_zero: bool = False) -> float:
    """'500ms', '30s', '10m', '2h', '2d', '1w' (also '10min') -> seconds; a bare number is refused,
    since whether it means seconds or minutes is a guess. `above_zero` refuses '0s' too."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    if not match or (above_zero and float(match.group(1)) <= 0):
        raise UsageError(f"bad {what} {text!r}: expected e.g. {DURATION_EXAMPLES}")
    return float(match.group(1)) * _DURATION_SECONDS[match.group(2).lower()]


def format_bytes(value: int | None, na: str = "N/A") -> str:
    """Bytes as a short binary size: '512M', '3.2G', '80G'."""
    if value is None:
        return na
    size = float(value)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(size) < 1024 or unit == "T":
            if unit == "B":
                return f"{int(size)}B"
            return f"{size:.1f}{unit}" if size < 10 else f"{size:.0f}{unit}"
        size /= 1024
    return f"{size:.0f}P"  # pragma: no cover - loop always returns


def format_runtime(seconds: float | None) -> str:
    """Seconds as H:MM:SS; '' when unknown."""
    if seconds is None:
        return ""
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def format_duration(seconds: float) -> str:
    """A span as people say it, two units at most: '45s', '12m', '2h12m', '3d4h'."""
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def format_time(t: float, now: float | None = None, seconds: bool = False) -> str:
    """A moment in local time, as every view shows one: '19:41' today, 'Wed 19:41' up to six days
    before or after today, '2026-12-20 19:41' further off (`seconds`: '19:41:05'). A bare clock
    from another day reads as today's, so the day comes with it. JSON, CSV and file names keep
    their machine formats; `now` is the day compared with (default: the present)."""
    at = time.localtime(t)
    clock = time.strftime("%H:%M:%S" if seconds else "%H:%M", at)
    days = dt.date(*at[:3]).toordinal() - dt.date(*time.localtime(time.time() if now is None else now)[:3]).toordinal()
    if days == 0:
        return clock
    return time.strftime("%a " if abs(days) <= 6 else "%Y-%m-%d ", at) + clock


def format_energy(joules: float | None, shared: bool | None = None, na: str = "") -> str:
    """A job's energy: Wh below a kWh, kWh above; `~` when other processes used its cards too."""
    if joules is None:
        return na
    wh = joules / 3600
    text = f"{wh:.1f} Wh" if wh < 1000 else f"{wh / 1000:.2f} kWh"
    return ("~" if shared else "") + text


def format_cpu_list(cpus: list[int] | tuple[int, ...]) -> str:
    """[0,1,2,3,8,9] -> '0-3,8-9', the form taskset and nvidia-smi use."""
    ranges: list[str] = []
    ordered = sorted(set(cpus))
    start = prev = None
    for cpu in ordered + [None]:
        if start is not None and (cpu is None or cpu != prev + 1):
            ranges.append(str(start) if start == prev else f"{start}-{prev}")
            start = None
        if cpu is not None and start is None:
            start = cpu
        prev = cpu
    return ",".join(ranges)


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8-9' -> [0, 1, 2, 3, 8, 9]."""
    cpus: list[int] = []
    for part in filter(None, text.split(",")):
        low, _, high = part.partition("-")
        try:
            cpus.extend(range(int(low), int(high or low) + 1))
        except ValueError:
            raise UsageError(f"bad CPU list {text!r}") from None
    return cpus
