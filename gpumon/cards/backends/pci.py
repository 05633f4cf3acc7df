"""Where a card sits on PCIe, from its sysfs device path, and nvidia-smi's word for the path
between two cards: the same for every vendor, so a composite links cards of different backends.

A PCI device's directory under /sys/devices is its path from the host bridge down:
`pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0`. Two cards' paths say what joins
them: the same host bridge only (PHB), one PCIe switch (PIX: each card at most a downstream port
below what they share), several (PXB); different host bridges on one NUMA node (NODE) or on two (SYS).
"""

from __future__ import annotations

import os
from collections.abc import Sequence


def pci_path(device: str) -> list[str]:
    """The components of a device's path from its host bridge ('pci0000:00') down; [] when not known."""
    parts = os.path.realpath(device).split(os.sep)
    starts = [i for i, part in enumerate(parts) if part.startswith("pci") and ":" in part]
    return parts[starts[-1]:] if starts and os.path.exists(device) else []


def device_of(sysfs: str, pci_bus_id: str) -> str:
    """A PCI device's sysfs directory from its bus id, in either spelling ('00000000:07:00.0')."""
    domain, _, rest = pci_bus_id.lower().partition(":")
    try:
        domain = f"{int(domain, 16):04x}"
    except ValueError:
        pass
    return os.path.join(sysfs, "bus", "pci", "devices", f"{domain}:{rest}")


def pcie_link(a: Sequence[str], b: Sequence[str], numa_a: int | None, numa_b: int | None) -> str | None:
    """nvidia-smi's word for the PCIe path between two devices; None when a path is not known."""
    if not a or not b:
        return None
    if a[0] != b[0]:
        return "SYS" if numa_a is not None and numa_b is not None and numa_a != numa_b else "NODE"
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    if common >= min(len(a), len(b)):
        return "X"  # the same device (or one below the other: not two cards)
    if common == 1:
        return "PHB"
    return "PIX" if max(len(a), len(b)) - common <= 2 else "PXB"
