"""Loading libnvidia-ml, turning its start-up errors into messages, and reading one card's fields
so that a field or function a card lacks is asked once and then remembered as unavailable."""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from gpumon.cards.backends.base import NO_CARDS_HINT
from gpumon.errors import NoDriverError
from gpumon.sanitize import printable

log = logging.getLogger(__name__)

NO_DRIVER_HINT = NO_CARDS_HINT
# Reading PCIe throughput blocks ~20 ms per counter on real cards; it is read this often at most.
PCIE_INTERVAL_S = 5.0
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF

_SKIP_FOREVER = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
}
# The whole library is gone (driver unloaded or reloaded): NVML must be initialised again.
DRIVER_GONE = {pynvml.NVML_ERROR_UNINITIALIZED, pynvml.NVML_ERROR_DRIVER_NOT_LOADED}
# An older driver lacks the newer call, or the newer struct version: try the next one.
_TRY_OLDER = {pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH}


class CardLost(Exception):
    pass


class DriverGone(Exception):
    """Every call fails with UNINITIALIZED / DRIVER_NOT_LOADED: the driver was unloaded or reloaded."""


class _ProcessInfoV1(ctypes.Structure):
    # Drivers before 470 only have the unversioned process calls with this struct; the
    # bindings no longer ship it, so it is declared here.
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


def _processes_v1(symbol: str, handle: Any) -> list[Any]:
    fn = pynvml._nvmlGetFunctionPointer(symbol)
    count = ctypes.c_uint(0)
    ret = fn(handle, ctypes.byref(count), None)
    if ret == pynvml.NVML_SUCCESS:
        return []
    if ret != pynvml.NVML_ERROR_INSUFFICIENT_SIZE:
        raise pynvml.NVMLError(ret)
    count.value = count.value * 2 + 5
    infos = (_ProcessInfoV1 * count.value)()
    pynvml._nvmlCheckReturn(fn(handle, ctypes.byref(count), infos))
    return list(infos[: count.value])


def decode(value: str | bytes) -> str:
    return printable(value.decode(errors="replace") if isinstance(value, bytes) else value)


def mask_to_ids(words: Any) -> list[int]:
    return [w * 64 + bit for w, word in enumerate(words) for bit in range(64) if word >> bit & 1]


def _fabric_call(function: str, struct: str) -> list[Callable[..., Any]]:
    """nvmlDeviceGetGpuFabricInfo* with one struct version, when the bindings have both."""
    fn, cls = getattr(pynvml, function, None), getattr(pynvml, struct, None)
    if fn is None or cls is None:
        return []

    def call(handle: Any) -> Any:
        info = cls()
        fn(handle, ctypes.byref(info))
        return info

    return [call]


def _retired_pages(cause: int) -> list[Callable[..., Any]]:
    return [lambda h: pynvml.nvmlDeviceGetRetiredPages_v2(h, cause),
            lambda h: pynvml.nvmlDeviceGetRetiredPages(h, cause)]


def versioned_calls() -> dict[str, list[Callable[..., Any]]]:
    """Versioned functions in the order they are tried; the first one the driver lacks is dropped."""
    return {
        # The fabric state of NVSwitch boards: v3 (health summary) -> v2 -> the original call.
        "fabric": (_fabric_call("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t")
                   + _fabric_call("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t")
                   + _fabric_call("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")),
        # Retired pages (the cards before row remapping): _v2 (with timestamps), else the original.
        "retired_sbe": _retired_pages(pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
        "retired_dbe": _retired_pages(pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
        "memory": [
            lambda h: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
            pynvml.nvmlDeviceGetMemoryInfo,
        ],
        "throttle": [
            pynvml.nvmlDeviceGetCurrentClocksEventReasons,
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons,
        ],
        "compute_procs": [
            pynvml.nvmlDeviceGetComputeRunningProcesses_v3,
            pynvml.nvmlDeviceGetComputeRunningProcesses_v2,
            lambda h: _processes_v1("nvmlDeviceGetComputeRunningProcesses", h),
        ],
        "graphics_procs": [
            pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3,
            pynvml.nvmlDeviceGetGraphicsRunningProcesses_v2,
            lambda h: _processes_v1("nvmlDeviceGetGraphicsRunningProcesses", h),
        ],
    }


class Card:
    """Per-card state that outlives a sample: handle, identity, slow-changing state (MIG slices,
    fabric), what not to ask again, and the bookkeeping of its lane (last answer, call in flight).

    Only the card's lane calls NVML for it; other threads only read these attributes."""

    def __init__(self, index: int, versions: dict[str, list[Callable[..., Any]]], lock: Any = None) -> None:
        self.index = index
        self.handle: Any = None
        self.opened = False  # identity read (or failed: then state says why)
        self.uuid: str | None = None
        self.name = "?"
        self.pci_bus_id: str | None = None
        self.minor_number: int | None = None  # its /dev/nvidiaN
        self.numa_node: int | None = None
        self.cpu_affinity: str | None = None
        self.skip: set[str] = set()
        self.state = "ok"
        self.error: str | None = None
        self.proc_util_ts = 0
        self.pcie: tuple[int | None, int | None] = (None, None)
        self.mig_mode: bool | None = None
        self.compute_mode: str | None = None  # COMPUTE_MODES' name; None: not told
        self.migs: list[tuple[Any, str, str]] = []  # (handle, MIG UUID, name) when MIG mode is on
        self.fabric: str | None = None
        self.slow_read_at = float("-inf")  # MIG slices and fabric state: re-read on a slow timer
        self.probe_at = 0.0  # a lost card is asked again for a new handle from then on
        self.pcie_read_at = -PCIE_INTERVAL_S
        # Health counters (backends/nvml/counters.py): the last ones read, and when (monotonic s).
        self.counters: Any = None
        self.counters_read_at = 0.0
        self.fields: Any = None  # (names, request) of the field values still asked for
        self.memory_temperature_max: int | None = None
        self.energy_integrated: float | None = None  # joules, where the driver has no energy counter
        self.power_at: float | None = None
        self.power_w = 0.0
        self.gpm: Any = None  # backends/nvml/gpm.py's state for the card
        # The lane's bookkeeping (monotonic seconds), kept by the backend.
        self.pending: Any = None  # Future of the read in flight
        self.asked_at = 0.0
        self.answered_at: float | None = None
        self.last: Any = None  # the GpuSample of the last answer
        self._versions = versions  # shared by all cards: a driver lacks a function for every card
        self._versions_lock = lock or threading.Lock()

    def read(self, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(handle, *args), or None when the card does not say (remembered for good when the
        card or driver cannot); raises CardLost when the card fell off the bus."""
        if key in self.skip:
            return None
        try:
            return fn(self.handle, *args)
        except pynvml.NVMLError as exc:
            return self.failed(key, exc)

    def read_versioned(self, key: str) -> Any:
        """Like read, trying newer functions first and dropping each the driver lacks."""
        if key in self.skip:
            return None
        versions = self._versions[key]
        while versions:
            newest = versions[0]
            try:
                return newest(self.handle)
            except pynvml.NVMLError as exc:
                if exc.value in _TRY_OLDER and len(versions) > 1:
                    with self._versions_lock:  # cards read on lanes of their own, all at once
                        if versions and versions[0] is newest:
                            versions.pop(0)
                    log.info("NVML: older %s call in use (driver lacks the newer one)", key)
                    continue
                return self.failed(key, exc)
        return None

    def failed(self, key: str, exc: pynvml.NVMLError) -> None:
        if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise CardLost(str(exc))
        if exc.value in DRIVER_GONE:
            raise DriverGone(str(exc))
        if exc.value in _SKIP_FOREVER:
            self.skip.add(key)
            log.info("NVML: card %d: %s unavailable (%s)", self.index, key, exc)
        else:
            self.state = "error"
            self.error = f"{key}: {exc}"
        return None


def load_library(path: str) -> None:
    if not os.path.exists(path):
        raise NoDriverError(f"NVML library not found: {path}")
    try:
        library = ctypes.CDLL(os.path.abspath(path))
    except OSError as exc:
        raise NoDriverError(f"cannot load NVML library {path}: {exc}") from None
    # The bindings cache function pointers by name; drop those of any earlier library.
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlLib = library


def init_error(exc: pynvml.NVMLError) -> NoDriverError:
    code = exc.value
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return NoDriverError(f"no NVIDIA driver found (libnvidia-ml.so.1 is missing); {NO_DRIVER_HINT}")
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return NoDriverError(f"the NVIDIA kernel driver is not loaded; {NO_DRIVER_HINT}")
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return NoDriverError(
            "NVIDIA driver was upgraded: reboot or reload the nvidia kernel modules "
            "(NVML library and kernel driver versions differ)"
        )
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return NoDriverError("no permission to use the NVIDIA driver (check /dev/nvidia* access)")
    return NoDriverError(f"NVML failed to start: {exc}; {NO_DRIVER_HINT}")
