"""Which CUDA device ordinal each NVML card gets in a program started from a given environment.

NVML (and nvidia-smi) number cards in PCI bus order. CUDA numbers them "fastest first" unless
CUDA_DEVICE_ORDER=PCI_BUS_ID, and then renumbers whatever CUDA_VISIBLE_DEVICES leaves visible.
This is the confusion every other tool leaves to README tips; gpumon shows the answer per card.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpumon.model import GpuSample

HIDDEN = "hidden"
UNKNOWN = "?"


def _pci_order(gpus: Sequence[GpuSample]) -> list[GpuSample]:
    return sorted(gpus, key=lambda g: g.pci_bus_id.lower())


def _base_order(gpus: Sequence[GpuSample], device_order: str | None) -> list[GpuSample] | None:
    """CUDA's enumeration before CUDA_VISIBLE_DEVICES; None when it cannot be known from here."""
    if device_order == "PCI_BUS_ID":
        return _pci_order(gpus)
    # FASTEST_FIRST (the default) ranks by compute power and breaks ties by PCI bus id; with one
    # model of card that is PCI order. Mixed models need the CUDA runtime to answer.
    if len({g.name for g in gpus}) <= 1:
        return _pci_order(gpus)
    return None


def _resolve(token: str, base: list[GpuSample]) -> GpuSample | None:
    token = token.strip()
    if token.isascii() and token.isdigit():
        i = int(token)
        return base[i] if i < len(base) else None
    if token.startswith("GPU-"):
        # CUDA accepts any unique prefix of a UUID.
        matches = [g for g in base if g.uuid.startswith(token)]
        return matches[0] if len(matches) == 1 else None
    return None


def cuda_ordinals(gpus: Sequence[GpuSample], env: Mapping[str, str]) -> dict[int, str] | None:
    """NVML index -> CUDA ordinal ("0", "1", …), "hidden" or "?".

    None when the environment sets neither variable: then there is nothing surprising to show.
    """
    visible = env.get("CUDA_VISIBLE_DEVICES")
    device_order = env.get("CUDA_DEVICE_ORDER")
    if visible is None and device_order is None:
        return None
    base = _base_order(gpus, device_order)
    if base is None:
        return {g.index: UNKNOWN for g in gpus}
    if visible is None:
        chosen = base
    else:
        chosen = []
        for token in visible.split(",") if visible.strip() else []:
            gpu = _resolve(token, base)
            if gpu is None or gpu in chosen:
                break  # CUDA stops at the first invalid entry; the rest are ignored
            chosen.append(gpu)
    ordinal = {g.index: str(i) for i, g in enumerate(chosen)}
    return {g.index: ordinal.get(g.index, HIDDEN) for g in gpus}
