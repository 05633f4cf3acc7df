"""What `gpumon doctor` asks the NVIDIA driver: which library answers, its versions, and which of the
functions gpumon reads cards with it lacks. Read once, in a process that then exits: never on a
sampling path."""

from __future__ import annotations

from dataclasses import dataclass, field

import pynvml

from gpumon.cards.backends.nvml.library import init_error, load_library
from gpumon.errors import NoDriverError

# A function gpumon reads cards with -> what is lost on a driver without it.
NEEDED = {
    "nvmlDeviceGetCount_v2": "no cards are listed",
    "nvmlDeviceGetHandleByIndex_v2": "no card can be opened",
    "nvmlDeviceGetMemoryInfo": "no memory use",
    "nvmlDeviceGetUtilizationRates": "no utilisation",
    "nvmlDeviceGetTemperature": "no temperature",
    "nvmlDeviceGetPowerUsage": "no power draw",
    "nvmlDeviceGetComputeRunningProcesses": "no processes on the cards",
    "nvmlDeviceGetUUID": "no card UUIDs (CUDA_VISIBLE_DEVICES by UUID, fleet ids)",
}
ESSENTIAL = {"nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2"}


@dataclass
class DriverReport:
    library: str | None = None  # the file that answered (or was asked for)
    load_error: str | None = None  # the library could not be loaded
    init_error: str | None = None  # it loaded, but nvmlInit failed
    driver_version: str | None = None
    nvml_version: str | None = None
    cards: int | None = None
    missing: dict[str, str] = field(default_factory=dict)  # function -> what is lost
    essential_missing: bool = False


def _loaded_path() -> str | None:
    """The libnvidia-ml file this process mapped (the dynamic linker's choice when none was named)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                if "libnvidia-ml" in line:
                    return line.split(None, 5)[-1].strip()
    except OSError:
        pass
    return None


def diagnose_driver(lib_path: str | None = None) -> DriverReport:
    report = DriverReport(library=lib_path)
    try:
        if lib_path:
            load_library(lib_path)
        else:
            pynvml._LoadNvmlLibrary()
    except NoDriverError as exc:
        report.load_error = str(exc)
        return report
    except pynvml.NVMLError:
        report.load_error = "libnvidia-ml.so.1 not found by the dynamic linker"
        return report
    report.library = _loaded_path() or lib_path
    library = pynvml.nvmlLib
    report.missing = {name: lost for name, lost in NEEDED.items() if not hasattr(library, name)}
    report.essential_missing = bool(ESSENTIAL & report.missing.keys())
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        report.init_error = str(init_error(exc))
        return report
    try:
        report.driver_version = _text(pynvml.nvmlSystemGetDriverVersion)
        report.nvml_version = _text(pynvml.nvmlSystemGetNVMLVersion)
        if not report.essential_missing:
            report.cards = pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        report.init_error = f"NVML started but does not answer: {exc}"
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return report


def _text(fn) -> str | None:
    try:
        value = fn()
    except pynvml.NVMLError:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else value


__all__ = ["DriverReport", "diagnose_driver"]
