"""The real driver, through nvidia-ml-py (the `pynvml` module). The only module that calls NVML.

Rules this module keeps, because real drivers vary:
- A field a card answers NOT_SUPPORTED / NO_PERMISSION, or a function the driver lacks, is
  remembered and never asked again; it reads None.
- A card that answers GPU_IS_LOST is "lost" from then on; an unexpected error makes that sample
  "error". Other cards keep reporting.
- Newer functions fall back to older ones when the driver lacks them (process v3 -> v2 -> v1,
  memory info v2 -> v1, clock-event reasons -> throttle reasons).
"""

from __future__ import annotations

import ctypes
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpumon.errors import NoDriverError
from gpumon.sanitize import printable
from gpumon.model import GpuSample, MigSample, ProcessSample, Snapshot, Topology, throttle_names
from gpumon.units import format_cpu_list

log = logging.getLogger(__name__)

NO_DRIVER_HINT = "try `gpumon --demo` to see simulated GPUs"
# Reading PCIe throughput blocks ~20 ms per counter on real cards; it is read this often at most.
PCIE_INTERVAL_S = 5.0
# nvidia-smi's topology legend for nvmlDeviceGetTopologyCommonAncestor levels.
TOPOLOGY_LEGEND = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
CPU_SET_WORDS = 16  # 1024 CPUs
NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF

_SKIP_FOREVER = {
    pynvml.NVML_ERROR_NOT_SUPPORTED,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    pynvml.NVML_ERROR_NO_PERMISSION,
}


class _CardLost(Exception):
    pass


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


def _decode(value: str | bytes) -> str:
    return printable(value.decode(errors="replace") if isinstance(value, bytes) else value)


def _mask_to_ids(words: Any) -> list[int]:
    return [w * 64 + bit for w, word in enumerate(words) for bit in range(64) if word >> bit & 1]


class _Card:
    """Per-card state that outlives a sample: handle, static identity, what not to ask again."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.uuid = ""
        self.name = "?"
        self.pci_bus_id = ""
        self.numa_node: int | None = None
        self.cpu_affinity: str | None = None
        self.skip: set[str] = set()
        self.state = "ok"
        self.error: str | None = None
        self.proc_util_ts = 0
        self.pcie: tuple[int | None, int | None] = (None, None)
        self.migs: list[tuple[Any, str, str]] = []  # (handle, MIG UUID, name) when MIG mode is on
        self.pcie_read_at = -PCIE_INTERVAL_S


class NvmlBackend:
    name = "nvml"
    real_pids = True

    def __init__(self, lib_path: str | None = None) -> None:
        lib_path = lib_path or os.environ.get("GPUMON_NVML_LIB") or None
        if lib_path:
            _load_library(lib_path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise _init_error(exc) from None
        self.host = socket.gethostname()
        # Versioned functions in the order they are tried; the first missing one is dropped.
        self._fallbacks: dict[str, list[Callable[..., Any]]] = {
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
        self.driver_version = self._system(pynvml.nvmlSystemGetDriverVersion)
        cuda = self._system(pynvml.nvmlSystemGetCudaDriverVersion)
        self.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        count = pynvml.nvmlDeviceGetCount()
        self.cards = [self._open_card(i) for i in range(count)]
        self._event_set: Any = None
        self._event_cards: dict[int | None, int] = {}
        self._events_failed = False

    # -- setup --

    def _system(self, fn: Callable[[], Any]) -> Any:
        try:
            return _decode(value) if isinstance(value := fn(), (str, bytes)) else value
        except pynvml.NVMLError:
            return None

    def _open_card(self, index: int) -> _Card:
        card = _Card(index)
        try:
            card.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            card.uuid = _decode(pynvml.nvmlDeviceGetUUID(card.handle))
            card.name = _decode(pynvml.nvmlDeviceGetName(card.handle))
            card.pci_bus_id = _decode(pynvml.nvmlDeviceGetPciInfo_v3(card.handle).busId)
        except pynvml.NVMLError as exc:
            card.state = "lost" if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST else "error"
            card.error = str(exc)
            return card
        card.cpu_affinity = self._cpu_affinity(card)
        card.numa_node = self._numa_node(card)
        card.migs = self._mig_slices(card)
        return card

    def _mig_slices(self, card: _Card) -> list[tuple[Any, str, str]]:
        """The card's MIG slices (read once: changing MIG mode needs a GPU reset anyway)."""
        mode = self._read(card, "mig", pynvml.nvmlDeviceGetMigMode)
        if not mode or not mode[0]:
            return []
        slices = []
        for i in range(self._read(card, "mig", pynvml.nvmlDeviceGetMaxMigDeviceCount) or 0):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card.handle, i)
                slices.append((handle, _decode(pynvml.nvmlDeviceGetUUID(handle)), _decode(pynvml.nvmlDeviceGetName(handle))))
            except pynvml.NVMLError:
                continue  # an index without a slice
        return slices

    def _cpu_affinity(self, card: _Card) -> str | None:
        words = self._read(card, "cpu_affinity", pynvml.nvmlDeviceGetCpuAffinity, CPU_SET_WORDS)
        cpus = _mask_to_ids(words) if words is not None else []
        return format_cpu_list(cpus) if cpus else None

    def _numa_node(self, card: _Card) -> int | None:
        words = self._read(
            card, "numa", pynvml.nvmlDeviceGetMemoryAffinity, 1, pynvml.NVML_AFFINITY_SCOPE_NODE
        )
        nodes = _mask_to_ids(words) if words is not None else []
        if nodes:
            return nodes[0]
        # Older drivers lack memory affinity; the kernel knows the PCI device's node.
        domain, _, rest = card.pci_bus_id.partition(":")
        sysfs = f"/sys/bus/pci/devices/{domain[-4:]}:{rest}".lower() + "/numa_node"
        try:
            with open(sysfs) as f:
                node = int(f.read())
        except (OSError, ValueError):
            return None
        return node if node >= 0 else None

    # -- reading fields --

    def _read(self, card: _Card, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        if key in card.skip:
            return None
        try:
            return fn(card.handle, *args)
        except pynvml.NVMLError as exc:
            return self._failed(card, key, exc)

    def _read_versioned(self, card: _Card, key: str) -> Any:
        """Like _read, trying newer functions first and dropping each the driver lacks."""
        if key in card.skip:
            return None
        versions = self._fallbacks[key]
        while versions:
            try:
                return versions[0](card.handle)
            except pynvml.NVMLError as exc:
                if exc.value == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND and len(versions) > 1:
                    versions.pop(0)
                    log.info("NVML: older %s call in use (driver lacks the newer one)", key)
                    continue
                return self._failed(card, key, exc)
        return None

    def _failed(self, card: _Card, key: str, exc: pynvml.NVMLError) -> None:
        if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
            raise _CardLost(str(exc))
        if exc.value in _SKIP_FOREVER:
            card.skip.add(key)
            log.info("NVML: card %d: %s unavailable (%s)", card.index, key, exc)
        else:
            card.state = "error"
            card.error = f"{key}: {exc}"
        return None

    # -- sampling --

    def sample(self) -> Snapshot:
        gpus = tuple(self._sample_card(card) for card in self.cards)
        return Snapshot(
            time=time.time(),
            host=self.host,
            backend=self.name,
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version,
            gpus=gpus,
        )

    def _identity(self, card: _Card, **values: Any) -> GpuSample:
        return GpuSample(
            index=card.index,
            uuid=card.uuid,
            name=card.name,
            pci_bus_id=card.pci_bus_id,
            numa_node=card.numa_node,
            cpu_affinity=card.cpu_affinity,
            **values,
        )

    def _sample_card(self, card: _Card) -> GpuSample:
        if card.handle is None or card.state == "lost":
            return self._identity(card, state=card.state, error=card.error)
        card.state, card.error = "ok", None
        try:
            values = self._card_values(card)
        except _CardLost as exc:
            card.state, card.error = "lost", str(exc)
            return self._identity(card, state="lost", error=card.error)
        return self._identity(card, state=card.state, error=card.error, **values)

    def _card_values(self, card: _Card) -> dict[str, Any]:
        read = self._read
        h = pynvml
        memory = self._read_versioned(card, "memory")
        total = memory.total if memory is not None else None
        util = read(card, "util", h.nvmlDeviceGetUtilizationRates)
        power = read(card, "power", h.nvmlDeviceGetPowerUsage)
        limit = read(card, "power_limit", h.nvmlDeviceGetEnforcedPowerLimit)
        pstate = read(card, "pstate", h.nvmlDeviceGetPerformanceState)
        throttle = self._read_versioned(card, "throttle")
        encoder = read(card, "encoder", h.nvmlDeviceGetEncoderUtilization)
        decoder = read(card, "decoder", h.nvmlDeviceGetDecoderUtilization)
        return {
            "utilization_gpu": util.gpu if util is not None else None,
            "utilization_memory": util.memory if util is not None else None,
            "memory_total": total,
            "memory_used": memory.used if memory is not None else None,
            "memory_free": memory.free if memory is not None else None,
            "temperature": read(card, "temperature", h.nvmlDeviceGetTemperature, h.NVML_TEMPERATURE_GPU),
            "fan": read(card, "fan", h.nvmlDeviceGetFanSpeed),
            "power_draw": power / 1000 if power is not None else None,
            "power_limit": limit / 1000 if limit is not None else None,
            "clock_sm": read(card, "clock_sm", h.nvmlDeviceGetClockInfo, h.NVML_CLOCK_SM),
            "clock_mem": read(card, "clock_mem", h.nvmlDeviceGetClockInfo, h.NVML_CLOCK_MEM),
            "pstate": f"P{pstate}" if pstate is not None and 0 <= pstate <= 15 else None,
            "throttle_reasons": throttle_names(throttle) if throttle is not None else None,
            "ecc_errors_uncorrected": read(
                card, "ecc", h.nvmlDeviceGetTotalEccErrors,
                h.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, h.NVML_VOLATILE_ECC,
            ),
            "pcie_tx": self._pcie(card)[0],
            "pcie_rx": card.pcie[1],
            "encoder_util": encoder[0] if encoder is not None else None,
            "decoder_util": decoder[0] if decoder is not None else None,
            "processes": self._processes(card, total),
            "mig_devices": tuple(self._mig_sample(*mig) for mig in card.migs),
        }

    def _mig_sample(self, handle: Any, uuid: str, name: str) -> MigSample:
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return MigSample(uuid, name, memory.total, memory.used)
        except pynvml.NVMLError:
            return MigSample(uuid, name)

    def _pcie(self, card: _Card) -> tuple[int | None, int | None]:
        now = time.monotonic()
        if now - card.pcie_read_at >= PCIE_INTERVAL_S:
            card.pcie_read_at = now
            tx = self._read(card, "pcie", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = self._read(card, "pcie", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            # NVML reports KB/s.
            card.pcie = (tx * 1024 if tx is not None else None, rx * 1024 if rx is not None else None)
        return card.pcie

    def _processes(self, card: _Card, total: int | None) -> tuple[ProcessSample, ...]:
        found: dict[int, ProcessSample] = {}
        for kind in ("compute", "graphics"):
            for info in self._read_versioned(card, f"{kind}_procs") or ():
                pid, used = int(info.pid), info.usedGpuMemory
                if used == NOT_AVAILABLE:
                    used = None
                # Drivers whose struct layout does not match the bindings return garbage
                # (the driver-535 break); an impossible entry is dropped, not shown.
                if pid <= 0 or (used is not None and total is not None and used > total):
                    log.info("NVML: card %d: dropped impossible process entry pid=%s", card.index, pid)
                    continue
                if pid in found:  # both compute and graphics: count it once, as compute
                    continue
                found[pid] = ProcessSample(pid=pid, type=kind, gpu_memory=used)
        if not found:
            return ()
        sm = self._process_sm_util(card)
        if sm is not None:
            found = {pid: _with_sm(p, sm.get(pid, 0)) for pid, p in found.items()}
        return tuple(found.values())

    def _process_sm_util(self, card: _Card) -> dict[int, int] | None:
        """SM % per pid from samples newer than the last call (NOT_FOUND: none were busy)."""
        if "proc_util" in card.skip:
            return None
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(card.handle, card.proc_util_ts)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                return {}
            return self._failed(card, "proc_util", exc)
        latest: dict[int, tuple[int, int]] = {}
        for s in samples:
            if s.timeStamp > latest.get(s.pid, (-1, 0))[0]:
                latest[s.pid] = (s.timeStamp, s.smUtil)
            card.proc_util_ts = max(card.proc_util_ts, s.timeStamp)
        return {pid: util for pid, (_, util) in latest.items()}

    # -- XID events --

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        """Block up to `timeout_s` for XID errors; (card index, XID) pairs. Call from one thread."""
        if self._event_set is None and not self._open_events():
            time.sleep(timeout_s)
            return []
        try:
            data = pynvml.nvmlEventSetWait_v2(self._event_set, int(timeout_s * 1000))
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_TIMEOUT:
                time.sleep(timeout_s)  # e.g. GPU lost: do not spin
            return []
        index = self._event_cards.get(ctypes.cast(data.device, ctypes.c_void_p).value)
        if index is None or data.eventType != pynvml.nvmlEventTypeXidCriticalError:
            return []
        return [(index, int(data.eventData))]

    def _open_events(self) -> bool:
        if self._events_failed:
            return False
        try:
            event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.info("NVML: no event support (%s): xid rules fire on nothing", exc)
            self._events_failed = True
            return False
        for card in self.cards:
            if card.handle is None:
                continue
            try:
                pynvml.nvmlDeviceRegisterEvents(card.handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
            except pynvml.NVMLError as exc:
                log.info("NVML: card %d: XID events unavailable (%s)", card.index, exc)
                continue
            self._event_cards[ctypes.cast(card.handle, ctypes.c_void_p).value] = card.index
        if not self._event_cards:
            self._events_failed = True
            return False
        self._event_set = event_set
        return True

    # -- topology --

    def topology(self) -> Topology:
        cards = [c for c in self.cards if c.handle is not None and c.state != "lost"]
        by_bus = {c.pci_bus_id.lower(): i for i, c in enumerate(cards)}
        nvlinks = [[0] * len(cards) for _ in cards]
        for i, card in enumerate(cards):
            for peer_bus in self._nvlink_peers(card):
                j = by_bus.get(peer_bus.lower())
                if j is not None:
                    nvlinks[i][j] += 1
        links: list[list[str | None]] = []
        for i, a in enumerate(cards):
            row: list[str | None] = []
            for j, b in enumerate(cards):
                if i == j:
                    row.append("X")
                elif nvlinks[i][j]:
                    row.append(f"NV{nvlinks[i][j]}")
                else:
                    row.append(self._common_ancestor(a, b))
            links.append(row)
        return Topology(
            indices=tuple(c.index for c in cards),
            links=tuple(tuple(r) for r in links),
            nvlinks=tuple(tuple(r) for r in nvlinks),
            cpu_affinity=tuple(c.cpu_affinity for c in cards),
            numa_node=tuple(c.numa_node for c in cards),
        )

    def _common_ancestor(self, a: _Card, b: _Card) -> str | None:
        try:
            level = pynvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)
        except pynvml.NVMLError:
            return None
        return TOPOLOGY_LEGEND.get(level)

    def _nvlink_peers(self, card: _Card) -> list[str]:
        peers = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if not pynvml.nvmlDeviceGetNvLinkState(card.handle, link):
                    continue
                peers.append(_decode(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(card.handle, link).busId))
            except pynvml.NVMLError:
                break  # NOT_SUPPORTED: no NVLink; INVALID_ARGUMENT: past the card's last link
        return peers

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _with_sm(p: ProcessSample, sm: int) -> ProcessSample:
    return ProcessSample(pid=p.pid, type=p.type, gpu_memory=p.gpu_memory, sm_util=sm)


def _load_library(path: str) -> None:
    if not os.path.exists(path):
        raise NoDriverError(f"NVML library not found: {path}")
    try:
        library = ctypes.CDLL(os.path.abspath(path))
    except OSError as exc:
        raise NoDriverError(f"cannot load NVML library {path}: {exc}") from None
    # The bindings cache function pointers by name; drop those of any earlier library.
    pynvml._nvmlGetFunctionPointer_cache.clear()
    pynvml.nvmlLib = library


def _init_error(exc: pynvml.NVMLError) -> NoDriverError:
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
