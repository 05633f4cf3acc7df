"""How good a link between two cards is, in nvidia-smi's legend, best first: NVLink (more links
better) > XGMI (AMD's Infinity Fabric) > PIX (one PCIe switch) > PXB (several switches) > PHB
(same host bridge) > NODE (same NUMA node) > SYS (across sockets). Used by placement, `gpumon topo`
and the TUI's topology view."""

from __future__ import annotations

from collections.abc import Sequence

from gpumon.model import GpuSample, Topology

# XGMI: AMD cards of one xGMI hive (Infinity Fabric), how many links sysfs does not say: below
# NVLink's counts, above any PCIe path.
LINK_RANK = {"XGMI": 0.995, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
UNKNOWN_RANK = 6
LINK_WORDS = {"XGMI": "AMD xGMI (one hive)", "PIX": "one PCIe switch", "PXB": "several PCIe switches",
              "PHB": "same PCIe host bridge", "NODE": "same NUMA node", "SYS": "across CPU sockets"}


def link_rank(link: str | None) -> float:
    """Lower is better. NVLink ranks below every PCIe path, more links ranking lower."""
    if link and link.startswith("NV"):
        try:
            return 1 - int(link[2:]) / 100  # NV12 -> 0.88, NV4 -> 0.96
        except ValueError:
            return 0.99
    return LINK_RANK.get(link or "", UNKNOWN_RANK)


def describe_link(link: str | None) -> str:
    if link and link.startswith("NV"):
        return f"{link[2:]} NVLinks"
    return LINK_WORDS.get(link or "", "unknown link")


def link_between(topo: Topology, a: int, b: int) -> str | None:
    """The link between cards with NVML indices a and b; None when either is not in `topo`."""
    if a not in topo.indices or b not in topo.indices:
        return None
    return topo.links[topo.indices.index(a)][topo.indices.index(b)]


def best_partners(topo: Topology, index: int) -> list[tuple[int, str | None]]:
    """The other cards, best connected to `index` first."""
    if index not in topo.indices:
        return []
    row = topo.links[topo.indices.index(index)]
    others = [(other, row[j]) for j, other in enumerate(topo.indices) if other != index]
    return sorted(others, key=lambda pair: (link_rank(pair[1]), pair[0]))


def unknown_links(gpus: Sequence[GpuSample]) -> Topology:
    """What is known before any link is read: the cards, their CPUs and NUMA nodes; links None.
    Cards that cannot be asked are left out."""
    usable = [g for g in gpus if g.state in ("ok", "error") and g.ref is not None]
    left_out = tuple((g.index, g.error or g.state) for g in gpus if g not in usable)
    return Topology(
        indices=tuple(g.index for g in usable),
        links=tuple(tuple("X" if a is b else None for b in usable) for a in usable),
        nvlinks=tuple(tuple(0 for _ in usable) for _ in usable),
        cpu_affinity=tuple(g.cpu_affinity for g in usable),
        numa_node=tuple(g.numa_node for g in usable),
        left_out=left_out,
    )
