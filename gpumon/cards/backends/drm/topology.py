"""Where cards sit on PCIe, from their sysfs device paths, in nvidia-smi's legend; and AMD's xGMI.

The paths and their words are backends/pci.py's (every backend's cards sit on PCIe).

xGMI: amdgpu links each card of a hive to `xgmi_hive_info`, whose `xgmi_hive_id` the cards share.
Cards of one hive are shown as "XGMI": joined by AMD's Infinity Fabric, directly or through other
cards of the hive. How many links, and how fast, sysfs does not say, so gpumon does not either.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpumon.cards.backends.pci import pcie_link
from gpumon.model import Topology


def link_matrix(indices: Sequence[int], paths: Sequence[Sequence[str]], numa: Sequence[int | None],
                cpus: Sequence[str | None], hives: Sequence[str | None], left_out=(), unknown=()) -> Topology:
    """The Topology of these cards (each a path, NUMA node, local CPUs and xGMI hive); `unknown`:
    (card, why) for cards whose xGMI hive could not be read (None in `hives`)."""
    links = []
    for i in range(len(indices)):
        row = []
        for j in range(len(indices)):
            if i == j:
                row.append("X")
            elif hives[i] is not None and hives[i] == hives[j]:
                row.append("XGMI")
            else:
                row.append(pcie_link(paths[i], paths[j], numa[i], numa[j]))
        links.append(tuple(row))
    return Topology(indices=tuple(indices), links=tuple(links),
                    nvlinks=tuple(tuple(0 for _ in indices) for _ in indices), cpu_affinity=tuple(cpus),
                    numa_node=tuple(numa), left_out=tuple(left_out), nvswitch=tuple(False for _ in indices),
                    unknown=tuple(unknown))
