"""Finding the AMD and Intel cards under /sys/class/drm, and reading small sysfs files safely.

A card is a `cardN` entry whose PCI device is bound to amdgpu, i915 or xe. Other DRM devices are
not GPUs gpumon reads: a server's BMC display adapter (ast, mgag200), virtual displays (bochs,
virtio), and NVIDIA's own nodes (nvidia-drm: its cards come from NVML). The driver is told by the
`device/driver` link, not by the PCI class: a BMC's adapter is a VGA controller too.

Every read here is of one small file; a file the kernel lacks (older kernels, other boards) or
refuses (EACCES, ENODEV, EIO while the card resets) reads None: "not known", never an error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpumon.cards.backends.drm.kinds import DRIVERS, ORDER

_CARD = re.compile(r"card\d+")
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_SPEED = re.compile(r"([0-9.]+)\s*GT/s")


def read_text(path: str) -> str | None:
    """The file's text, stripped; None when it cannot be read (absent, refused, device gone)."""
    try:
        with open(path, "rb") as file:
            data = file.read(65536)
    except OSError:
        return None
    return data.decode(errors="replace").strip()


def read_int(path: str, base: int = 10) -> int | None:
    text = read_text(path)
    if not text:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def link_speed(path: str) -> float | None:
    """'16.0 GT/s PCIe' -> 16.0 (GT/s); 'Unknown' (a link that is down) -> None."""
    match = _SPEED.search(read_text(path) or "")
    return float(match.group(1)) if match else None


def link_width(path: str) -> int | None:
    width = read_int(path)
    return width if width else None  # 0: the link is down


@dataclass(frozen=True, slots=True)
class CardNode:
    """A DRM card of a vendor gpumon reads: where it is and what it is. Read once; none of these
    files wakes a sleeping card (they are the PCI core's, kept in memory)."""

    name: str  # "card1"
    path: str  # <sysfs>/class/drm/card1
    device: str  # its PCI device's directory, links resolved
    pci_address: str  # "0000:03:00.0", as the kernel writes it (lower case, 4-digit domain)
    driver: str  # "amdgpu" | "i915" | "xe"
    vendor: str  # "amd" | "intel"
    pci_id: str  # "1002:73bf"
    subsystem_id: str | None  # "1002:0e3a"
    numa_node: int | None
    local_cpus: str | None  # "0-15,32-47"

    @property
    def pci_bus_id(self) -> str:
        """NVML's spelling of the address (8-digit domain, upper case), so ids read alike."""
        domain, rest = self.pci_address.split(":", 1)
        return f"{int(domain, 16):08X}:{rest.upper()}"


def _pci_id(device: str, vendor_file: str, device_file: str) -> str | None:
    vendor, model = read_int(os.path.join(device, vendor_file), 16), read_int(os.path.join(device, device_file), 16)
    return None if vendor is None or model is None else f"{vendor:04x}:{model:04x}"


def card_node(class_drm: str, name: str) -> CardNode | None:
    """The card `name` under `class_drm`, or None when it is not an AMD or Intel GPU (or gone)."""
    path = os.path.join(class_drm, name)
    device_link = os.path.join(path, "device")
    try:
        driver = os.path.basename(os.readlink(os.path.join(device_link, "driver")))
        device = os.path.realpath(device_link)
    except OSError:
        return None  # no driver bound, or the card went away while we looked
    vendor = DRIVERS.get(driver)
    address = os.path.basename(device).lower()
    pci_id = _pci_id(device, "vendor", "device")
    if vendor is None or pci_id is None or not _PCI_ADDRESS.fullmatch(address):
        return None
    numa = read_int(os.path.join(device, "numa_node"))
    return CardNode(name=name, path=path, device=device, pci_address=address, driver=driver, vendor=vendor,
                    pci_id=pci_id, subsystem_id=_pci_id(device, "subsystem_vendor", "subsystem_device"),
                    numa_node=numa if numa is not None and numa >= 0 else None,  # -1: no NUMA
                    local_cpus=read_text(os.path.join(device, "local_cpulist")) or None)


def find_cards(sysfs: str) -> list[CardNode]:
    """Every AMD and Intel card, AMD first, each vendor's in PCI bus order (the order ROCm and
    Level Zero number them in, so the index of a card among its vendor's is its number there)."""
    class_drm = os.path.join(sysfs, "class", "drm")
    try:
        names = [n for n in os.listdir(class_drm) if _CARD.fullmatch(n)]
    except OSError:
        return []
    cards = [card for name in names if (card := card_node(class_drm, name)) is not None]
    return sorted(cards, key=lambda c: (ORDER[c.vendor], c.pci_address))


def runtime_status(card: CardNode) -> str | None:
    """The kernel's runtime power state: 'active', 'suspended', 'suspending', 'resuming' (None:
    runtime PM not there). Read before anything else of the card: this file never wakes it."""
    return read_text(os.path.join(card.device, "power", "runtime_status"))


def render_node_device(sysfs: str, node: str) -> str | None:
    """The PCI address of a DRM node ('renderD128', 'card1'), for clients whose fdinfo does not
    name their device (drm-pdev is newer than the stats themselves)."""
    device = os.path.join(sysfs, "class", "drm", node, "device")
    address = os.path.basename(os.path.realpath(device)).lower() if os.path.exists(device) else ""
    return address if _PCI_ADDRESS.fullmatch(address) else None
