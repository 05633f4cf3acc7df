"""Which cards a job gets and what its environment says, so it lands on exactly those cards.

One function, `pin`, used by every launch path (CLI, TUI, the supervisor of a queued job): cards
are passed by UUID (MIG slices by MIG UUID) with CUDA_DEVICE_ORDER=PCI_BUS_ID, so neither CUDA's
"fastest first" order nor an inherited CUDA_VISIBLE_DEVICES can move the job to another card.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from gpumon.errors import UsageError
from gpumon.model import GpuSample, Snapshot, Topology
from gpumon.placement import choose
from gpumon.units import parse_cpu_list


def _norm_bus(bus: str) -> str:
    """'0000:17:00.0', '00000000:17:00.0' and '17:00.0' name the same device."""
    bus = bus.lower()
    parts = bus.split(":")
    if len(parts) == 3:
        parts[0] = parts[0].lstrip("0")
    elif len(parts) == 2:
        parts.insert(0, "")
    return ":".join(parts)


def resolve_spec(spec: str, snapshot: Snapshot, topo: Topology | None = None,
                 min_free: str | None = None, max_util: float | None = None) -> list[GpuSample]:
    """GPU SPEC -> cards: NVML index, UUID (GPU-…, MIG-…, unique prefix), PCI bus id, a comma
    list of these, or auto[:N] (the N least-loaded free cards, best connected)."""
    spec = spec.strip()
    if not spec:
        raise UsageError("empty --gpu: expected an index, a UUID, a PCI bus id or auto[:N]")
    if spec == "auto" or spec.startswith("auto:"):
        count_text = spec.partition(":")[2] or "1"
        if not (count_text.isascii() and count_text.isdigit()) or int(count_text) < 1:
            raise UsageError(f"bad --gpu {spec!r}: auto:N needs a whole number N of at least 1")
        try:
            return list(choose(snapshot, int(count_text), topo, min_free, max_util).gpus)
        except ValueError as exc:
            raise UsageError(f"--gpu {spec}: {exc}") from None
    chosen: list[GpuSample] = []
    for part in spec.split(","):
        gpu = _one(part.strip(), snapshot, spec)
        if gpu in chosen:
            raise UsageError(f"bad --gpu {spec!r}: card {gpu.index} is named twice")
        chosen.append(gpu)
    return chosen


def _one(part: str, snapshot: Snapshot, spec: str) -> GpuSample:
    gpus = snapshot.gpus
    if part.isascii() and part.isdigit():  # "¹".isdigit() is true too
        match = [g for g in gpus if g.index == int(part)]
        if not match:
            raise UsageError(f"bad --gpu {spec!r}: no card {part} (cards are {_indices(snapshot)})")
        return match[0]
    if part.upper().startswith("MIG-"):
        # A MIG slice stands in for its card, under its own UUID and memory, so it is pinned by it.
        match = [dataclasses.replace(g, uuid=m.uuid, name=m.name, memory_total=m.memory_total,
                                     memory_used=m.memory_used,
                                     memory_free=None if m.memory_total is None or m.memory_used is None
                                     else m.memory_total - m.memory_used)
                 for g in gpus for m in g.mig_devices if m.uuid.lower().startswith(part.lower())]
        if len(match) == 1:
            return match[0]
        problem = "matches several MIG slices" if match else "matches no MIG slice"
        raise UsageError(f"bad --gpu {spec!r}: {part!r} {problem}")
    if part.upper().startswith("GPU-"):
        match = [g for g in gpus if g.uuid.lower().startswith(part.lower())]
        if len(match) == 1:
            return match[0]
        problem = "matches several cards" if match else "matches no card"
        raise UsageError(f"bad --gpu {spec!r}: UUID {part!r} {problem}")
    if ":" in part:
        match = [g for g in gpus if _norm_bus(g.pci_bus_id) == _norm_bus(part)]
        if match:
            return match[0]
        raise UsageError(f"bad --gpu {spec!r}: no card at PCI bus id {part!r}")
    raise UsageError(f"bad --gpu {spec!r}: {part!r} is not an index, a UUID, a PCI bus id or auto[:N]")


def _indices(snapshot: Snapshot) -> str:
    return ", ".join(str(g.index) for g in snapshot.gpus) or "none"


@dataclass(frozen=True)
class Pinning:
    uuids: tuple[str, ...]
    indices: tuple[int, ...]
    cpus: tuple[int, ...] | None  # None: leave affinity alone
    env: dict[str, str]


def local_cpus(gpus: list[GpuSample]) -> tuple[int, ...] | None:
    """The CPUs next to the cards (NVML affinity), within the CPUs this process may use."""
    near: set[int] = set()
    for gpu in gpus:
        if gpu.cpu_affinity:
            near.update(parse_cpu_list(gpu.cpu_affinity))
    if not near:
        return None
    allowed = os.sched_getaffinity(0)
    both = near & allowed
    return tuple(sorted(both)) if both else None  # none of them usable here: do not pin at all


def pin(gpus: list[GpuSample], job_id: str, numa: bool = True) -> Pinning:
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(g.uuid for g in gpus),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUMON_JOB_ID": job_id,
    }
    return Pinning(
        uuids=tuple(g.uuid for g in gpus), indices=tuple(g.index for g in gpus),
        cpus=local_cpus(gpus) if numa else None, env=env,
    )
