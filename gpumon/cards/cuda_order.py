"""Which CUDA device ordinal each NVML card gets in a program started from a given environment.

NVML (and nvidia-smi) number cards in PCI bus order. CUDA numbers them "fastest first" unless
CUDA_DEVICE_ORDER=PCI_BUS_ID, and then renumbers whatever CUDA_VISIBLE_DEVICES leaves visible.
This is the confusion every other tool leaves to README tips; gpumon shows the answer per card.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpumon.model import GpuSample
from gpumon.vendors import vendor

HIDDEN = "hidden"
UNKNOWN = "?"


def _pci_order(gpus: Sequence[GpuSample]) -> list[GpuSample]:
    return sorted(gpus, key=lambda g: (g.pci_bus_id or "").lower())


def _base_order(gpus: Sequence[GpuSample], device_order: str | None) -> list[GpuSample] | None:
    """CUDA's enumeration before CUDA_VISIBLE_DEVICES; None when it cannot be known from here."""
    if device_order == "PCI_BUS_ID":
        return _pci_order(gpus)
    # FASTEST_FIRST (the default) ranks by compute power and breaks ties by PCI bus id; with one
    # model of card that is PCI order. Mixed models need the CUDA runtime to answer.
    if len({g.name for g in gpus}) <= 1:
        return _pci_order(gpus)
    return None


def _by_uuid(token: str, gpus: Sequence[GpuSample]) -> GpuSample | None:
    """The card a UUID entry names, whatever CUDA's order: CUDA accepts any unique prefix, and a
    MIG slice's UUID puts its card there."""
    if token.startswith("MIG-"):
        matches = [g for g in gpus if any(m.uuid.startswith(token) for m in g.mig_devices)]
    else:
        matches = [g for g in gpus if g.uuid and g.uuid.startswith(token)]
    return matches[0] if len(matches) == 1 else None


def cuda_ordinals(gpus: Sequence[GpuSample], env: Mapping[str, str]) -> dict[int, str] | None:
    """NVML index -> CUDA ordinal ("0", "1", …), "hidden" or "?" (depends on CUDA's own order).

    None when the environment sets neither variable: then there is nothing surprising to show.
    Entries of CUDA_VISIBLE_DEVICES that are UUIDs name their card for certain; only integer
    entries depend on CUDA's enumeration order, which gpumon cannot know for mixed models under
    the default FASTEST_FIRST order.
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    device_order = env.get("CUDA_DEVICE_ORDER")
    if visible is None and device_order is None:
        return None
    gpus = [g for g in gpus if vendor(g.vendor).cuda]  # CUDA never sees AMD or Intel cards: no ordinal
    base = _base_order(gpus, device_order)
    if visible is None:
        if base is None:
            return {g.index: UNKNOWN for g in gpus}
        return {g.index: str(i) for i, g in enumerate(base)}
    ordinal: dict[int, str] = {}
    unknown_entries = False  # integer entries whose card only CUDA knows
    position = 0
    for token in (t.strip() for t in visible.split(",")) if visible.strip() else ():
        if token.isascii() and token.isdigit():
            if int(token) >= len(gpus):
                break  # CUDA stops at the first invalid entry; the rest are ignored
            if base is None:
                unknown_entries = True
                position += 1
                continue
            gpu = base[int(token)]
        else:
            gpu = _by_uuid(token, gpus)
        if gpu is None or gpu.index in ordinal:
            break
        ordinal[gpu.index] = str(position)
        position += 1
    rest = UNKNOWN if unknown_entries else HIDDEN
    return {g.index: ordinal.get(g.index, rest) for g in gpus}


ALLOCATION_MARKS = ("SLURM_JOB_ID", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "NVIDIA_VISIBLE_DEVICES")


def granted(gpus: Sequence[GpuSample], env: Mapping[str, str]) -> tuple[set[int], set[int], str] | None:
    """The indices of the cards an allocation grants this environment (a Slurm job's
    CUDA_VISIBLE_DEVICES, a container's; on AMD cards a Slurm job's ROCR_VISIBLE_DEVICES), those of
    the cards its variable speaks of (CUDA's or AMD's), and the allocation in words; None where there is none.
    A CUDA_VISIBLE_DEVICES of the user's own (an earlier `select --export` in this shell) is no
    allocation: only one beside Slurm's or the container toolkit's variables is. An entry whose card
    only CUDA's own order could tell (integers, mixed models) grants nothing here: gpumon does not guess."""
    visible = env.get("CUDA_VISIBLE_DEVICES")
    marks = [m for m in ALLOCATION_MARKS if env.get(m)]
    rocr = env.get("ROCR_VISIBLE_DEVICES")
    if (visible is None and rocr is None) or not marks:
        return None
    job = env.get("SLURM_JOB_ID")
    who = f"Slurm job {job}" if job else marks[0]
    if visible is None and rocr is not None:  # AMD's: ROCm's own numbers or its UUIDs, of AMD cards
        amd = [g for g in gpus if g.vendor == "amd"]
        named = {g.index for token in (t.strip() for t in rocr.split(",")) for g in amd
                 if token == g.uuid or (token.isascii() and token.isdigit() and g.vendor_index == int(token))}
        return named, {g.index for g in amd}, f"{who}: ROCR_VISIBLE_DEVICES={rocr}"
    ordinals = cuda_ordinals(gpus, env) or {}
    return ({index for index, ordinal in ordinals.items() if ordinal.isdigit()},
            {g.index for g in gpus if vendor(g.vendor).cuda}, f"{who}: CUDA_VISIBLE_DEVICES={visible}")
