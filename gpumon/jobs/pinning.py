"""The environment that pins a job to its cards, per vendor, so it lands on exactly those cards.

- NVIDIA: CUDA_VISIBLE_DEVICES by UUID (MIG slices by MIG UUID) with CUDA_DEVICE_ORDER=PCI_BUS_ID, so
  neither CUDA's "fastest first" order nor an inherited CUDA_VISIBLE_DEVICES can move the job.
- AMD: ROCR_VISIBLE_DEVICES, by ROCm's UUID (GPU-<unique_id>) where the card has one, else by its
  number in ROCm's order (KFD's topology lists cards in PCI bus order). HIP applies
  HIP_VISIBLE_DEVICES and CUDA_VISIBLE_DEVICES (which HIP also reads) on top of ROCR's choice,
  renumbered: one inherited from the shell would move or hide the card, so the job has neither.
- Intel: ZE_AFFINITY_MASK, the card's number among the Level Zero devices, in PCI order
  (ZE_ENABLE_PCI_ID_DEVICE_ORDER=1: Level Zero's own order is the driver's). Level Zero renumbers
  the devices the mask leaves from 0, so SYCL's ONEAPI_DEVICE_SELECTOR is `level_zero:*` (the
  Level Zero devices, which are now only these): `level_zero:<number>` would name a device that,
  past the mask, no longer has that number.
CPUs next to the cards (their NUMA node) for all of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpumon.errors import UsageError
from gpumon.model import GpuSample
from gpumon.units import parse_cpu_list

# What each vendor's pinning removes from the job's environment.
UNSET = {
    "nvidia": (),
    "amd": ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"),
    "intel": ("SYCL_DEVICE_FILTER",),  # SYCL refuses to start when it is set beside ONEAPI_DEVICE_SELECTOR
}
# The variable that names the cards, per vendor (what `gpumon select` prints).
VISIBLE = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES", "intel": "ZE_AFFINITY_MASK"}


@dataclass(frozen=True)
class Pinning:
    uuids: tuple[str, ...]  # how the job's records name the cards: UUIDs, or PCI bus ids without one
    indices: tuple[int, ...]
    cpus: tuple[int, ...] | None  # None: leave affinity alone
    env: dict[str, str]
    unset: tuple[str, ...] = ()  # variables the job must not inherit

    @property
    def visible(self) -> str:
        """The value that names the cards: CUDA_VISIBLE_DEVICES', ROCR_VISIBLE_DEVICES', ZE_AFFINITY_MASK'."""
        return next(self.env[name] for name in VISIBLE.values() if name in self.env)


def local_cpus(gpus: list[GpuSample]) -> tuple[int, ...] | None:
    """The CPUs next to the cards (NVML affinity, sysfs local_cpulist), within the CPUs this
    process may use."""
    near: set[int] = set()
    for gpu in gpus:
        if gpu.cpu_affinity:
            near.update(parse_cpu_list(gpu.cpu_affinity))
    if not near:
        return None
    allowed = os.sched_getaffinity(0)
    both = near & allowed
    return tuple(sorted(both)) if both else None  # none of them usable here: do not pin at all


def one_vendor(gpus: list[GpuSample]) -> str:
    """The cards' vendor; a UsageError when they are of several (no runtime sees them together)."""
    vendors = sorted({g.vendor for g in gpus})
    if len(vendors) > 1:
        names = ", ".join(f"GPU {g.index} ({g.vendor})" for g in gpus)
        raise UsageError(f"one job's cards must be of one vendor: {names}")
    return vendors[0] if vendors else "nvidia"


def _numbers(gpus: list[GpuSample], vendor: str) -> list[str]:
    missing = [g.index for g in gpus if g.vendor_index is None]
    if missing:
        raise UsageError(f"GPU {missing[0]}: its {vendor} device number is not known (is the card there?)")
    return [str(g.vendor_index) for g in gpus]


def vendor_env(gpus: list[GpuSample]) -> tuple[dict[str, str], tuple[str, ...]]:
    """(variables to set, variables to remove) that show a program exactly these cards."""
    vendor = one_vendor(gpus)
    if vendor == "amd":
        names = [g.uuid for g in gpus] if all(g.uuid for g in gpus) else _numbers(gpus, vendor)
        env = {"ROCR_VISIBLE_DEVICES": ",".join(n for n in names if n)}
    elif vendor == "intel":
        env = {"ZE_AFFINITY_MASK": ",".join(_numbers(gpus, vendor)), "ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1",
               "ONEAPI_DEVICE_SELECTOR": "level_zero:*"}
    else:
        env = {"CUDA_VISIBLE_DEVICES": ",".join(g.uuid or "" for g in gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    return env, UNSET.get(vendor, ())


def pin(gpus: list[GpuSample], job_id: str, numa: bool = True) -> Pinning:
    env, unset = vendor_env(gpus)
    env["GPUMON_JOB_ID"] = job_id
    return Pinning(
        uuids=tuple(g.ref or "" for g in gpus), indices=tuple(g.index for g in gpus),
        cpus=local_cpus(gpus) if numa else None, env=env, unset=unset,
    )
