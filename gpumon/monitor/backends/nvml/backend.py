"""Sampling every card through NVML: identity once at start, then the moving values each sample."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import pynvml

from gpumon.model import GpuSample, MigSample, ProcessSample, Snapshot, Topology, throttle_names
from gpumon.monitor.backends.nvml.events import XidEvents
from gpumon.monitor.backends.nvml.library import (
    NOT_AVAILABLE,
    PCIE_INTERVAL_S,
    Card,
    CardLost,
    decode,
    init_error,
    load_library,
    mask_to_ids,
    versioned_calls,
)
from gpumon.monitor.backends.nvml.topology import read_topology
from gpumon.units import format_cpu_list

log = logging.getLogger(__name__)
CPU_SET_WORDS = 16  # 1024 CPUs


class NvmlBackend:
    name = "nvml"
    real_pids = True

    def __init__(self, lib_path: str | None = None) -> None:
        lib_path = lib_path or os.environ.get("GPUMON_NVML_LIB") or None
        if lib_path:
            load_library(lib_path)
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise init_error(exc) from None
        self.host = socket.gethostname()
        self._versions = versioned_calls()
        self.driver_version = self._system(pynvml.nvmlSystemGetDriverVersion)
        cuda = self._system(pynvml.nvmlSystemGetCudaDriverVersion)
        self.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        count = pynvml.nvmlDeviceGetCount()
        self.cards = [self._open_card(i) for i in range(count)]
        self._xid = XidEvents(self.cards)

    # -- setup --

    def _system(self, fn: Callable[[], Any]) -> Any:
        try:
            return decode(value) if isinstance(value := fn(), (str, bytes)) else value
        except pynvml.NVMLError:
            return None

    def _open_card(self, index: int) -> Card:
        card = Card(index, self._versions)
        try:
            card.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            card.uuid = decode(pynvml.nvmlDeviceGetUUID(card.handle))
            card.name = decode(pynvml.nvmlDeviceGetName(card.handle))
            card.pci_bus_id = decode(pynvml.nvmlDeviceGetPciInfo_v3(card.handle).busId)
        except pynvml.NVMLError as exc:
            card.state = "lost" if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST else "error"
            card.error = str(exc)
            return card
        card.cpu_affinity = self._cpu_affinity(card)
        card.numa_node = self._numa_node(card)
        card.migs = self._mig_slices(card)
        return card

    def _mig_slices(self, card: Card) -> list[tuple[Any, str, str]]:
        """The card's MIG slices (read once: changing MIG mode needs a GPU reset anyway)."""
        mode = card.read("mig", pynvml.nvmlDeviceGetMigMode)
        if not mode or not mode[0]:
            return []
        slices = []
        for i in range(card.read("mig", pynvml.nvmlDeviceGetMaxMigDeviceCount) or 0):
            try:
                handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card.handle, i)
                slices.append((handle, decode(pynvml.nvmlDeviceGetUUID(handle)), decode(pynvml.nvmlDeviceGetName(handle))))
            except pynvml.NVMLError:
                continue  # an index without a slice
        return slices

    def _cpu_affinity(self, card: Card) -> str | None:
        words = card.read("cpu_affinity", pynvml.nvmlDeviceGetCpuAffinity, CPU_SET_WORDS)
        cpus = mask_to_ids(words) if words is not None else []
        return format_cpu_list(cpus) if cpus else None

    def _numa_node(self, card: Card) -> int | None:
        words = card.read("numa", pynvml.nvmlDeviceGetMemoryAffinity, 1, pynvml.NVML_AFFINITY_SCOPE_NODE)
        nodes = mask_to_ids(words) if words is not None else []
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

    def _identity(self, card: Card, **values: Any) -> GpuSample:
        return GpuSample(
            index=card.index,
            uuid=card.uuid,
            name=card.name,
            pci_bus_id=card.pci_bus_id,
            numa_node=card.numa_node,
            cpu_affinity=card.cpu_affinity,
            **values,
        )

    def _sample_card(self, card: Card) -> GpuSample:
        if card.handle is None or card.state == "lost":
            return self._identity(card, state=card.state, error=card.error)
        card.state, card.error = "ok", None
        try:
            values = self._card_values(card)
        except CardLost as exc:
            card.state, card.error = "lost", str(exc)
            return self._identity(card, state="lost", error=card.error)
        return self._identity(card, state=card.state, error=card.error, **values)

    def _card_values(self, card: Card) -> dict[str, Any]:
        read = card.read
        h = pynvml
        memory = card.read_versioned("memory")
        total = memory.total if memory is not None else None
        util = read("util", h.nvmlDeviceGetUtilizationRates)
        power = read("power", h.nvmlDeviceGetPowerUsage)
        limit = read("power_limit", h.nvmlDeviceGetEnforcedPowerLimit)
        pstate = read("pstate", h.nvmlDeviceGetPerformanceState)
        throttle = card.read_versioned("throttle")
        encoder = read("encoder", h.nvmlDeviceGetEncoderUtilization)
        decoder = read("decoder", h.nvmlDeviceGetDecoderUtilization)
        return {
            "utilization_gpu": util.gpu if util is not None else None,
            "utilization_memory": util.memory if util is not None else None,
            "memory_total": total,
            "memory_used": memory.used if memory is not None else None,
            "memory_free": memory.free if memory is not None else None,
            "temperature": read("temperature", h.nvmlDeviceGetTemperature, h.NVML_TEMPERATURE_GPU),
            "fan": read("fan", h.nvmlDeviceGetFanSpeed),
            "power_draw": power / 1000 if power is not None else None,
            "power_limit": limit / 1000 if limit is not None else None,
            "clock_sm": read("clock_sm", h.nvmlDeviceGetClockInfo, h.NVML_CLOCK_SM),
            "clock_mem": read("clock_mem", h.nvmlDeviceGetClockInfo, h.NVML_CLOCK_MEM),
            "pstate": f"P{pstate}" if pstate is not None and 0 <= pstate <= 15 else None,
            "throttle_reasons": throttle_names(throttle) if throttle is not None else None,
            "ecc_errors_uncorrected": read(
                "ecc", h.nvmlDeviceGetTotalEccErrors,
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

    def _pcie(self, card: Card) -> tuple[int | None, int | None]:
        now = time.monotonic()
        if now - card.pcie_read_at >= PCIE_INTERVAL_S:
            card.pcie_read_at = now
            tx = card.read("pcie", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_TX_BYTES)
            rx = card.read("pcie", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_RX_BYTES)
            # NVML reports KB/s.
            card.pcie = (tx * 1024 if tx is not None else None, rx * 1024 if rx is not None else None)
        return card.pcie

    def _processes(self, card: Card, total: int | None) -> tuple[ProcessSample, ...]:
        found: dict[int, ProcessSample] = {}
        for kind in ("compute", "graphics"):
            for info in card.read_versioned(f"{kind}_procs") or ():
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

    def _process_sm_util(self, card: Card) -> dict[int, int] | None:
        """SM % per pid from samples newer than the last call (NOT_FOUND: none were busy)."""
        if "proc_util" in card.skip:
            return None
        try:
            samples = pynvml.nvmlDeviceGetProcessUtilization(card.handle, card.proc_util_ts)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_NOT_FOUND:
                return {}
            return card.failed("proc_util", exc)
        latest: dict[int, tuple[int, int]] = {}
        for s in samples:
            if s.timeStamp > latest.get(s.pid, (-1, 0))[0]:
                latest[s.pid] = (s.timeStamp, s.smUtil)
            card.proc_util_ts = max(card.proc_util_ts, s.timeStamp)
        return {pid: util for pid, (_, util) in latest.items()}

    # -- XID events and topology --

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        """Block up to `timeout_s` for XID errors; (card index, XID) pairs. Call from one thread."""
        return self._xid.wait(timeout_s)

    def topology(self) -> Topology:
        return read_topology(self.cards)

    def close(self) -> None:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def _with_sm(p: ProcessSample, sm: int) -> ProcessSample:
    return ProcessSample(pid=p.pid, type=p.type, gpu_memory=p.gpu_memory, sm_util=sm)
