"""What a vendor is to gpumon, as a record per vendor: how people call it, how a job is pinned to its
cards, its runtime's name, where its health words differ from NVIDIA's, which backend reads its
cards and under which exporter families its cards are served. No I/O; everything may import it.

A module that would ask "is this an AMD card?" reads the card's record instead (`vendor(gpu.vendor)`),
so a new vendor is a backend folder (`cards/backends/<name>/`, exposing `BACKEND`) and one entry
here (`register`). A name no record has (another host's newer gpumon) gets a record of its own
words and no way to pin a job: nothing here guesses what its runtime reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpumon.errors import UsageError

DEFAULT_VENDOR = "nvidia"  # whose card a sample is when nobody said (NVML's, dcgm-exporter's, schema 1's)


@dataclass(frozen=True)
class Visibility:
    """The variables that show a program exactly the cards it was given."""

    variable: str  # the one that names the cards (what `gpumon select` prints)
    # How each card is named in it: "uuid" (every card has one), "uuid_or_number" (UUIDs when every
    # card has one, else numbers), "number" (the card's number in its runtime: GpuSample.vendor_index).
    names: str
    also: tuple[tuple[str, str], ...] = ()  # set beside it, always
    unset: tuple[str, ...] = ()  # removed from the job's environment: they would move or hide its cards


@dataclass(frozen=True)
class Vendor:
    name: str  # as samples, JSON and the exporter's `vendor` label say it
    words: str  # as people read it: "NVIDIA"
    runtime: str  # what its programs run on: "CUDA"; also the word for its device numbers
    runtime_short: str  # the same, where a panel's title has little room
    visibility: Visibility | None  # None: gpumon cannot pin a job to such a card
    backend: str  # which backend reads this machine's cards of this vendor (cards/backends/<backend>)
    exporter: str  # the key of the exporter families its cards are served under besides dcgm-exporter's
    article: str = "an"  # "an NVIDIA card", "an AMD card"
    # Health rules whose words for NVIDIA's cards would be wrong for this vendor's: rule code ->
    # (text, action); the rule's own words otherwise (health/rules.py).
    health_words: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    cuda: bool = False  # CUDA numbers its cards (CUDA_VISIBLE_DEVICES, CUDA ordinals apply)
    hotspot: bool = False  # its cards' junction temperature is worth a field of its own in a panel

    @property
    def a_card(self) -> str:
        return f"{self.article} {self.words} card"

    def pin_names(self, uuids: list[str | None], numbers: list[int | None], cards: list[int]) -> str:
        """The value of `visibility.variable` for these cards (their UUIDs, their numbers in the
        runtime, their indices for messages); a UsageError when the cards cannot be named."""
        if self.visibility is None:
            raise UsageError(f"GPU {cards[0]}: gpumon does not know how to pin a job to {self.a_card}")
        how = self.visibility.names
        if how == "uuid" or (how == "uuid_or_number" and all(uuids)):
            return ",".join(u or "" for u in uuids)
        missing = [card for card, number in zip(cards, numbers, strict=True) if number is None]
        if missing:
            raise UsageError(f"GPU {missing[0]}: its {self.name} device number is not known (is the card there?)")
        return ",".join(str(n) for n in numbers)


_GONE = ("the card is gone from sysfs (unplugged, fallen off the bus, or its driver unbound)",
         "reboot (or rescan the PCI bus); if it happens again, check its power and seating, then service (RMA)")

_VENDORS: dict[str, Vendor] = {}


def register(record: Vendor) -> Vendor:
    """Add (or replace) a vendor; the order of registration is the order hosts' backends are opened
    in, so the first vendor's cards keep the lowest indices."""
    _VENDORS[record.name] = record
    return record


def unregister(name: str) -> None:
    _VENDORS.pop(name, None)


def vendor(name: str) -> Vendor:
    """The record of a vendor name; for a name no record has, one that only says the name."""
    known = _VENDORS.get(name)
    if known is not None:
        return known
    return Vendor(name=name, words=name, runtime=name, runtime_short=name, visibility=None, backend="",
                  exporter="")


def known(name: str) -> bool:
    return name in _VENDORS


def vendors() -> tuple[Vendor, ...]:
    return tuple(_VENDORS.values())


def visible_variables() -> tuple[str, ...]:
    """Every vendor's variable that names the cards."""
    return tuple(v.visibility.variable for v in _VENDORS.values() if v.visibility is not None)


register(Vendor(
    "nvidia", "NVIDIA", "CUDA", "CUDA",
    # By UUID (MIG slices by MIG UUID) with CUDA_DEVICE_ORDER=PCI_BUS_ID, so neither CUDA's "fastest
    # first" order nor an inherited CUDA_VISIBLE_DEVICES can move the job.
    Visibility("CUDA_VISIBLE_DEVICES", "uuid", also=(("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),)),
    backend="nvml", exporter="dcgm", cuda=True))
register(Vendor(
    "amd", "AMD", "ROCm", "ROCm",
    # By ROCm's UUID (GPU-<unique_id>) where every card has one, else by its number in ROCm's order
    # (KFD's topology lists cards in PCI bus order). HIP applies HIP_VISIBLE_DEVICES and
    # CUDA_VISIBLE_DEVICES (which HIP also reads) on top of ROCR's choice, renumbered: one inherited
    # from the shell would move or hide the card, so the job has neither.
    Visibility("ROCR_VISIBLE_DEVICES", "uuid_or_number",
               unset=("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")),
    backend="drm", exporter="amd", hotspot=True,
    health_words={
        "lost": _GONE,
        "ecc_uncorrected": ("{value:g} uncorrectable errors since the driver loaded (amdgpu RAS, every block)",
                            "drain the card and reboot (amdgpu resets it after such an error); if they come back, "
                            "the card needs service (RMA)"),
        "retired_pending": ("bad memory pages are waiting to be retired (amdgpu: pending)",
                            "reset the card or reboot to retire the pending pages (drain its jobs first)"),
    }))
register(Vendor(
    "intel", "Intel", "Level Zero", "L0",
    # The card's number among the Level Zero devices, in PCI order (ZE_ENABLE_PCI_ID_DEVICE_ORDER=1:
    # Level Zero's own order is the driver's). Level Zero renumbers the devices the mask leaves
    # from 0, so SYCL's ONEAPI_DEVICE_SELECTOR is `level_zero:*` (the Level Zero devices, which are
    # now only these): `level_zero:<number>` would name a device that, past the mask, no longer has
    # that number. SYCL refuses to start when SYCL_DEVICE_FILTER is set beside ONEAPI_DEVICE_SELECTOR.
    Visibility("ZE_AFFINITY_MASK", "number",
               also=(("ZE_ENABLE_PCI_ID_DEVICE_ORDER", "1"), ("ONEAPI_DEVICE_SELECTOR", "level_zero:*")),
               unset=("SYCL_DEVICE_FILTER",)),
    backend="drm", exporter="intel", health_words={"lost": _GONE}))
