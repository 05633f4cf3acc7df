"""How the cards connect: NVLinks, the PCIe path between each pair, CPU and NUMA affinity."""

from __future__ import annotations

import pynvml

from gpumon.model import Topology
from gpumon.monitor.backends.nvml.library import Card, decode

# nvidia-smi's topology legend for nvmlDeviceGetTopologyCommonAncestor levels.
TOPOLOGY_LEGEND = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def read_topology(all_cards: list[Card]) -> Topology:
    cards = [c for c in all_cards if c.handle is not None and c.state != "lost"]
    by_bus = {c.pci_bus_id.lower(): i for i, c in enumerate(cards)}
    nvlinks = [[0] * len(cards) for _ in cards]
    for i, card in enumerate(cards):
        for peer_bus in _nvlink_peers(card):
            j = by_bus.get(peer_bus.lower())
            if j is not None:
                nvlinks[i][j] += 1
    links: list[list[str | None]] = []
    for i, a in enumerate(cards):
        row: list[str | None] = []
        for j, b in enumerate(cards):
            if i == j:
                row.append("X")
            elif nvlinks[i][j]:
                row.append(f"NV{nvlinks[i][j]}")
            else:
                row.append(_common_ancestor(a, b))
        links.append(row)
    return Topology(
        indices=tuple(c.index for c in cards),
        links=tuple(tuple(r) for r in links),
        nvlinks=tuple(tuple(r) for r in nvlinks),
        cpu_affinity=tuple(c.cpu_affinity for c in cards),
        numa_node=tuple(c.numa_node for c in cards),
    )


def _common_ancestor(a: Card, b: Card) -> str | None:
    try:
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)
    except pynvml.NVMLError:
        return None
    return TOPOLOGY_LEGEND.get(level)


def _nvlink_peers(card: Card) -> list[str]:
    peers = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(card.handle, link):
                continue
            peers.append(decode(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(card.handle, link).busId))
        except pynvml.NVMLError:
            break  # NOT_SUPPORTED: no NVLink; INVALID_ARGUMENT: past the card's last link
    return peers
