"""A card's name from its PCI id, through the system's pci.ids (the file lspci reads), when the
board has no name file of its own. No pci.ids, or a card newer than it: "AMD GPU 1002:744c"."""

from __future__ import annotations

import functools
import re

from gpumon.vendors import vendor as vendor_record

PCI_IDS = ("/usr/share/hwdata/pci.ids", "/usr/share/misc/pci.ids", "/usr/share/pci.ids")
_BRACKETS = re.compile(r"\[(.+)\]")


@functools.lru_cache(maxsize=64)
def lookup(pci_id: str, paths: tuple[str, ...] = PCI_IDS) -> str | None:
    """The device's line in pci.ids: 'Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]'."""
    vendor, _, device = pci_id.partition(":")
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as file:
                in_vendor = False
                for line in file:
                    if not line.strip() or line.startswith("#"):
                        continue
                    if not line.startswith("\t"):
                        if in_vendor:
                            return None  # past our vendor's devices
                        in_vendor = line[:4].lower() == vendor
                    elif in_vendor and not line.startswith("\t\t") and line[1:5].lower() == device:
                        return line[5:].strip()
        except OSError:
            continue
    return None


def card_name(vendor: str, pci_id: str, product_name: str | None = None,
              paths: tuple[str, ...] = PCI_IDS) -> str:
    """'AMD Instinct MI210' (the board's own name), 'AMD Radeon RX 6800/6800 XT / 6900 XT' (the
    marketing name pci.ids gives in brackets), or 'AMD GPU 1002:73bf'."""
    words = vendor_record(vendor).words
    if product_name:
        return product_name if product_name.lower().startswith(words.lower()) else f"{words} {product_name}"
    entry = lookup(pci_id, paths)
    if entry is None:
        return f"{words} GPU {pci_id}"
    match = _BRACKETS.search(entry)
    return f"{words} {match.group(1) if match else entry}"
