"""The moving values of one card, read each sample on the card's lane: utilisation, memory,
sensors, clocks, PCIe, its processes, its MIG slices' memory."""

from __future__ import annotations

import logging
import time
from typing import Any

import pynvml

from gpumon.cards.backends.nvml.counters import integrate_power
from gpumon.cards.backends.nvml.library import NOT_AVAILABLE, PCIE_INTERVAL_S, Card, CardLost
from gpumon.model import MigSample, ProcessSample, throttle_names

log = logging.getLogger(__name__)


def card_values(card: Card) -> dict[str, Any]:
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
    integrate_power(card, power / 1000 if power is not None else None)
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
        "pcie_tx": _pcie(card)[0],
        "pcie_rx": card.pcie[1],
        "encoder_util": encoder[0] if encoder is not None else None,
        "decoder_util": decoder[0] if decoder is not None else None,
        "processes": _processes(card, total),
        "mig_devices": _mig_samples(card),
    }


def _mig_samples(card: Card) -> tuple[MigSample, ...]:
    found = []
    for handle, uuid, name in card.migs:
        try:
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise CardLost(str(exc)) from None
            # The slice was destroyed (or the card reconfigured): its handle is stale. Leave it
            # out now and read the slices again at the next sample.
            card.slow_read_at = float("-inf")
            continue
        found.append(MigSample(uuid, name, memory.total, memory.used))
    return tuple(found)


def _pcie(card: Card) -> tuple[int | None, int | None]:
    now = time.monotonic()
    if now - card.pcie_read_at >= PCIE_INTERVAL_S:
        card.pcie_read_at = now
        tx = card.read("pcie", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        rx = card.read("pcie", pynvml.nvmlDeviceGetPcieThroughput, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        # NVML reports KB/s.
        card.pcie = (tx * 1024 if tx is not None else None, rx * 1024 if rx is not None else None)
    return card.pcie


def _processes(card: Card, total: int | None) -> tuple[ProcessSample, ...]:
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
    sm = _process_sm_util(card)
    if sm is not None:
        found = {pid: _with_sm(p, sm.get(pid, 0)) for pid, p in found.items()}
    return tuple(found.values())


def _process_sm_util(card: Card) -> dict[int, int] | None:
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
    newest = card.proc_util_ts
    for s in samples:
        # Each field read once: the bindings' structs run Python code on every attribute read.
        stamp, pid = s.timeStamp, s.pid
        if stamp > latest.get(pid, (-1, 0))[0]:
            latest[pid] = (stamp, s.smUtil)
        newest = max(newest, stamp)
    card.proc_util_ts = newest
    return {pid: util for pid, (_, util) in latest.items()}


def _with_sm(p: ProcessSample, sm: int) -> ProcessSample:
    return ProcessSample(pid=p.pid, type=p.type, gpu_memory=p.gpu_memory, sm_util=sm)
