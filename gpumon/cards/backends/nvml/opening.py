"""A card's identity and slow-changing state: opened once, read again after a reset, and (MIG
slices, fabric state, compute mode) re-read on a slow timer. Every function here runs on the card's lane."""

from __future__ import annotations

import logging
import time
from typing import Any

import pynvml

from gpumon.cards.backends.nvml.library import DRIVER_GONE, Card, CardLost, DriverGone, decode, mask_to_ids
from gpumon.units import format_cpu_list

log = logging.getLogger(__name__)
CPU_SET_WORDS = 16  # 1024 CPUs
# MIG slices are created and destroyed while the machine runs, and the fabric manager finishes
# registering cards after boot: both are read again this often (and at once after an error).
SLOW_STATE_S = 10.0
# nvmlComputeMode_t: who may open a context on the card (`nvidia-smi -c`), as the JSON names it.
COMPUTE_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
# A lost card is asked for a new handle this often: it comes back after a reset or fabric recovery.
PROBE_LOST_S = 5.0


def open_card(card: Card) -> None:
    """Read the card's identity and affinity. Never raises for the card's own trouble: its state
    says so ("lost", "error"); DriverGone goes up, it concerns every card."""
    card.opened = True
    try:
        card.handle = pynvml.nvmlDeviceGetHandleByIndex(card.index)
        card.uuid = decode(pynvml.nvmlDeviceGetUUID(card.handle))
        card.name = decode(pynvml.nvmlDeviceGetName(card.handle))
        card.pci_bus_id = decode(pynvml.nvmlDeviceGetPciInfo_v3(card.handle).busId)
        card.minor_number = card.read("minor", pynvml.nvmlDeviceGetMinorNumber)
        card.cpu_affinity = _cpu_affinity(card)
        card.numa_node = _numa_node(card)
        read_slow_state(card)
    except pynvml.NVMLError as exc:
        _opening_failed(card, exc.value == pynvml.NVML_ERROR_GPU_IS_LOST, exc, exc.value)
    except CardLost as exc:
        _opening_failed(card, True, exc)
    except (ValueError, TypeError, OSError) as exc:  # a driver answering nonsense: this card only
        _opening_failed(card, False, exc)
    else:
        if card.state != "error":  # a field that failed while opening says so in the first sample
            card.state, card.error = "ok", None


def _opening_failed(card: Card, lost: bool, exc: Exception, code: int | None = None) -> None:
    if code in DRIVER_GONE:
        raise DriverGone(str(exc))
    card.state = "lost" if lost else "error"
    card.error = f"{exc} (while being opened)"
    card.probe_at = time.monotonic() + PROBE_LOST_S
    log.info("NVML: card %d: %s", card.index, card.error)


def probe(card: Card) -> bool:
    """A lost (or never opened) card: ask the driver for a fresh handle, by UUID when it is known
    (indices can move after a driver reload), and open it again when it answers."""
    now = time.monotonic()
    if now < card.probe_at:
        return False
    card.probe_at = now + PROBE_LOST_S
    try:
        handle = (pynvml.nvmlDeviceGetHandleByUUID(card.uuid) if card.uuid
                  else pynvml.nvmlDeviceGetHandleByIndex(card.index))
        pynvml.nvmlDeviceGetName(handle)  # answers only when the card is back
    except pynvml.NVMLError as exc:
        if exc.value in DRIVER_GONE:
            raise DriverGone(str(exc)) from None
        return False
    log.info("NVML: card %d (%s) answers again", card.index, card.uuid)
    card.skip.clear()
    card.fields = card.gpm = card.counters = None  # what the card supports is asked again
    card.slow_read_at = float("-inf")
    open_card(card)
    return card.state == "ok"


def read_slow_state(card: Card, force: bool = False) -> None:
    """MIG mode and slices, and the fabric state, when SLOW_STATE_S has passed (or `force`)."""
    now = time.monotonic()
    if not force and now - card.slow_read_at < SLOW_STATE_S:
        return
    card.slow_read_at = now
    mode = card.read("mig", pynvml.nvmlDeviceGetMigMode)
    card.mig_mode = bool(mode[0]) if mode else (None if "mig" in card.skip else False)
    card.migs = _mig_slices(card) if card.mig_mode else []
    compute = card.read("compute_mode", pynvml.nvmlDeviceGetComputeMode)
    card.compute_mode = COMPUTE_MODES.get(compute) if compute is not None else None
    info = card.read_versioned("fabric")
    card.fabric = fabric_state(info) if info is not None else None


def _mig_slices(card: Card) -> list[tuple[Any, str, str]]:
    slices = []
    for i in range(card.read("mig", pynvml.nvmlDeviceGetMaxMigDeviceCount) or 0):
        try:
            handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(card.handle, i)
            slices.append((handle, decode(pynvml.nvmlDeviceGetUUID(handle)), decode(pynvml.nvmlDeviceGetName(handle))))
        except pynvml.NVMLError as exc:
            if exc.value == pynvml.NVML_ERROR_GPU_IS_LOST:
                raise CardLost(str(exc)) from None
            continue  # an index without a slice
    return slices


def fabric_state(info: Any) -> str | None:
    """nvmlGpuFabricInfo* -> one of model.FABRIC_STATES, or None for a card with no fabric."""
    state = info.state
    if state == pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED:
        return "not_started"  # the fabric manager is not running (yet)
    if state == pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS:
        return "in_progress"
    if state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED:
        return None
    if info.status != pynvml.NVML_SUCCESS:
        return "failed"
    unhealthy = (getattr(pynvml, "NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY", 2),
                 getattr(pynvml, "NVML_GPU_FABRIC_HEALTH_SUMMARY_LIMITED_CAPACITY", 3))
    return "degraded" if getattr(info, "healthSummary", 0) in unhealthy else "ready"


def _cpu_affinity(card: Card) -> str | None:
    words = card.read("cpu_affinity", pynvml.nvmlDeviceGetCpuAffinity, CPU_SET_WORDS)
    cpus = mask_to_ids(words) if words is not None else []
    return format_cpu_list(cpus) if cpus else None


def _numa_node(card: Card) -> int | None:
    words = card.read("numa", pynvml.nvmlDeviceGetMemoryAffinity, 1, pynvml.NVML_AFFINITY_SCOPE_NODE)
    nodes = mask_to_ids(words) if words is not None else []
    if nodes:
        return nodes[0]
    # Older drivers lack memory affinity; the kernel knows the PCI device's node.
    domain, _, rest = (card.pci_bus_id or "").partition(":")
    sysfs = f"/sys/bus/pci/devices/{domain[-4:]}:{rest}".lower() + "/numa_node"
    try:
        with open(sysfs) as f:
            node = int(f.read())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None
