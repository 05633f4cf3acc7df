"""One host's cards of several vendors as one backend: NVIDIA's (NVML, keeping their NVML indices)
first, then AMD's and Intel's (from the kernel), numbered on from there.

Both answer per card with a deadline (`answers_per_card`, each card on a lane of its own): the
kernel's files are asked for first, then NVML, and both are waited for up to the same deadline,
so a hung card of either vendor delays the pass by that deadline at most. Links between an NVIDIA
card and another vendor's are PCIe paths, read from sysfs like the AMD and Intel cards' own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from gpumon.cards.backends.drm import DrmBackend
from gpumon.cards.backends.drm.backend import DEFAULT_WAIT_S
from gpumon.cards.backends.drm.topology import device_of, pci_path, pcie_link
from gpumon.model import Snapshot, Topology


class CompositeBackend:
    real_pids = True
    answers_per_card = True

    def __init__(self, nvml, drm: DrmBackend) -> None:
        self.nvml, self.drm = nvml, drm
        self.name = nvml.name
        self.procfs = drm.procfs

    def sample(self, wait_s: float | None = None) -> Snapshot:
        wait_s = DEFAULT_WAIT_S if wait_s is None else wait_s
        deadline = time.monotonic() + wait_s
        self.drm.ask(deadline)
        first = self.nvml.sample(wait_s=max(0.0, deadline - time.monotonic()))
        return dataclasses.replace(first, gpus=first.gpus + self.drm.collect(deadline).gpus)

    def identity(self, wait_s: float) -> Snapshot:
        first = self.nvml.identity(wait_s)
        return dataclasses.replace(first, gpus=first.gpus + self.drm.identity().gpus)

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        return self.nvml.wait_xid(timeout_s)

    def topology(self, wait_s: float | None = None,
                 on_progress: Callable[[Topology], None] | None = None) -> Topology:
        deadline = time.monotonic() + (DEFAULT_WAIT_S if wait_s is None else wait_s)
        nvidia = self.nvml.topology(wait_s=wait_s)
        others = self.drm.topology(wait_s=max(0.0, deadline - time.monotonic()))
        paths = {c.index: pci_path(device_of(self.drm.sysfs, c.pci_bus_id)) for c in self.nvml.cards if c.pci_bus_id}
        paths.update({c.index: pci_path(c.node.device) for c in self.drm.cards if c.present})
        indices = nvidia.indices + others.indices
        numa = nvidia.numa_node + others.numa_node
        links = []
        for i, a in enumerate(indices):
            row = []
            for j, b in enumerate(indices):
                if i < len(nvidia.indices) and j < len(nvidia.indices):
                    row.append(nvidia.links[i][j])
                elif i >= len(nvidia.indices) and j >= len(nvidia.indices):
                    row.append(others.links[i - len(nvidia.indices)][j - len(nvidia.indices)])
                else:
                    row.append(pcie_link(paths.get(a, []), paths.get(b, []), numa[i], numa[j]))
            links.append(tuple(row))
        width = len(others.indices)
        return Topology(
            indices=indices, links=tuple(links),
            nvlinks=tuple(row + (0,) * width for row in nvidia.nvlinks)
            + tuple((0,) * len(indices) for _ in others.indices),
            cpu_affinity=nvidia.cpu_affinity + others.cpu_affinity, numa_node=numa,
            left_out=nvidia.left_out + others.left_out, unknown=nvidia.unknown + others.unknown,
            nvswitch=(nvidia.nvswitch or (False,) * len(nvidia.indices)) + (False,) * width)

    def close(self) -> None:
        self.drm.close()
        self.nvml.close()
