"""The environment that pins a job to its cards, so it lands on exactly those cards.

Which variables, and how their value is built, is the cards' vendor's to say (`gpumon/vendors.py`:
NVIDIA's CUDA_VISIBLE_DEVICES by UUID, AMD's ROCR_VISIBLE_DEVICES, Intel's ZE_AFFINITY_MASK, and
why). CPUs next to the cards (their NUMA node) for all of them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpumon.errors import UsageError
from gpumon.model import GpuSample
from gpumon.units import parse_cpu_list
from gpumon.vendors import DEFAULT_VENDOR, vendor, visible_variables


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
        return named_cards(self.env)


def named_cards(env: dict[str, str]) -> str:
    """The value of the variable (whichever vendor's) in `env` that names the cards."""
    return next(env[name] for name in visible_variables() if name in env)


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
    return vendors[0] if vendors else DEFAULT_VENDOR


def vendor_env(gpus: list[GpuSample]) -> tuple[dict[str, str], tuple[str, ...]]:
    """(variables to set, variables to remove) that show a program exactly these cards."""
    record = vendor(one_vendor(gpus))
    names = record.pin_names([g.uuid for g in gpus], [g.vendor_index for g in gpus], [g.index for g in gpus])
    visibility = record.visibility
    assert visibility is not None  # pin_names refuses a vendor without one
    return {visibility.variable: names, **dict(visibility.also)}, visibility.unset


def pin(gpus: list[GpuSample], job_id: str, numa: bool = True) -> Pinning:
    env, unset = vendor_env(gpus)
    env["GPUMON_JOB_ID"] = job_id
    return Pinning(
        uuids=tuple(g.ref or "" for g in gpus), indices=tuple(g.index for g in gpus),
        cpus=local_cpus(gpus) if numa else None, env=env, unset=unset,
    )
