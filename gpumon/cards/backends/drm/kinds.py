"""The vendors the kernel's DRM drivers give cards of, as a table (as nvtop's per-vendor extractors):
which drivers are theirs, what of a card is read beside the files every DRM card has, and why such a
card may have no health counters. The backend, `sysfs` and `ras` read the card's row, never its name.

A new vendor read through the kernel is a row here, a reader of its files, and its record in
gpumon/vendors.py (`backend="drm"`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DrmKind:
    vendor: str  # its name in gpumon/vendors.py
    drivers: tuple[str, ...]  # the kernel drivers bound to its cards (the `device/driver` link)
    values: str  # which reader gives its values: "amdgpu" | "intel" (backend.py's READERS)
    identity: bool  # a card has an identity of its own to read once awake (amdgpu: unique_id, VBIOS, xGMI hive)
    ras: bool  # its cards have RAS error counters (amdgpu's device/ras)
    no_counters: str  # why one of its cards has no health counters, in the verdict's note


# In the order their cards are numbered: AMD's first, each vendor's in PCI bus order.
KINDS: tuple[DrmKind, ...] = (
    DrmKind("amd", ("amdgpu",), "amdgpu", identity=True, ras=True,
            no_counters="amdgpu reports no RAS error counters for this card "
                        "(it has them on Instinct and some Radeon Pro boards)"),
    DrmKind("intel", ("i915", "xe"), "intel", identity=False, ras=False,
            no_counters="i915 and xe report no error counters in sysfs"),
)
BY_VENDOR = {kind.vendor: kind for kind in KINDS}
DRIVERS = {driver: kind.vendor for kind in KINDS for driver in kind.drivers}
ORDER = {kind.vendor: n for n, kind in enumerate(KINDS)}


def no_cards(sysfs: str) -> str:
    """What a machine without AMD or Intel cards is told (the vendors' words, where it looked)."""
    from gpumon.vendors import vendors

    words = " or ".join(v.words for v in vendors() if v.name in BY_VENDOR)
    return f"no {words} GPU under {sysfs}/class/drm"
