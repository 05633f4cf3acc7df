"""One host's cards of several backends as one: each part's cards numbered after the last part's
(open_backend opens NVML first, so NVIDIA's cards keep their NVML indices, then AMD's and Intel's
from the kernel).

Every part is asked first (`ask`: the kernel's files go to their lanes), then each is collected
up to the same deadline, so a hung card of any part delays the pass by that deadline at most.
Links between cards of different parts are PCIe paths, read from sysfs like the AMD and Intel
cards' own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from gpumon.cards.backends.base import Backend, PerCardBackend
from gpumon.cards.backends.pci import pcie_link
from gpumon.model import Snapshot, Topology

DEFAULT_WAIT_S = 2.0  # how long sample() and topology() wait for slow cards when the caller does not say


class CompositeBackend(PerCardBackend):
    def __init__(self, parts: Sequence[Backend], sysfs: str = "/sys") -> None:
        if not parts:
            raise ValueError("a composite backend needs at least one part")
        self.parts = tuple(parts)
        self.sysfs = sysfs
        self.name = self.parts[0].name
        self.real_pids = all(p.real_pids for p in self.parts)
        self.procfs = next((p.procfs for p in self.parts if p.procfs is not None), None)
        self._xid_parts = [p for p in self.parts if p.xid_events]
        self.xid_events = bool(self._xid_parts)

    def _merged(self, snapshots: list[Snapshot]) -> Snapshot:
        return dataclasses.replace(snapshots[0], gpus=tuple(g for s in snapshots for g in s.gpus))

    def sample(self, wait_s: float | None = None) -> Snapshot:
        deadline = time.monotonic() + (DEFAULT_WAIT_S if wait_s is None else wait_s)
        self.ask(deadline)
        return self.collect(deadline)

    def ask(self, deadline: float) -> None:
        # The kernel's parts first: their lanes start reading while NVML's sample waits for its own.
        for part in reversed(self.parts):
            part.ask(deadline)

    def collect(self, deadline: float) -> Snapshot:
        return self._merged([part.collect(deadline) for part in self.parts])

    def identity(self, wait_s: float) -> Snapshot | None:
        deadline = time.monotonic() + wait_s
        known = [s for p in self.parts if (s := p.identity(max(0.0, deadline - time.monotonic()))) is not None]
        return self._merged(known) if known else None

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        if not self._xid_parts:
            return super().wait_xid(timeout_s)
        first, *others = self._xid_parts  # each numbers its cards as the composite does
        return [*first.wait_xid(timeout_s), *(e for p in others for e in p.wait_xid(0.0))]

    def index_count(self) -> int:
        return sum(p.index_count() for p in self.parts)

    def pci_paths(self, sysfs: str) -> dict[int, Sequence[str]]:
        return {index: path for p in self.parts for index, path in p.pci_paths(sysfs).items()}

    def topology(self, wait_s: float | None = None,
                 on_progress: Callable[[Topology], None] | None = None) -> Topology:
        deadline = time.monotonic() + (DEFAULT_WAIT_S if wait_s is None else wait_s)
        tops = []
        for n, part in enumerate(self.parts):
            left = wait_s if n == 0 else max(0.0, deadline - time.monotonic())
            tops.append(part.topology_within(left))
        paths = self.pci_paths(self.sysfs)
        indices = tuple(i for t in tops for i in t.indices)
        numa = tuple(x for t in tops for x in t.numa_node)
        owner = [n for n, t in enumerate(tops) for _ in t.indices]  # which part each row is
        starts = [sum(len(t.indices) for t in tops[:n]) for n in range(len(tops))]
        links = []
        for i, a in enumerate(indices):
            row = []
            for j, b in enumerate(indices):
                if owner[i] == owner[j]:
                    row.append(tops[owner[i]].links[i - starts[owner[i]]][j - starts[owner[j]]])
                else:
                    row.append(pcie_link(paths.get(a, []), paths.get(b, []), numa[i], numa[j]))
            links.append(tuple(row))
        nvlinks = []
        for i in range(len(indices)):
            mine = tops[owner[i]]
            nvlinks.append(tuple(mine.nvlinks[i - starts[owner[i]]][j - starts[owner[j]]]
                                 if owner[j] == owner[i] and mine.nvlinks else 0 for j in range(len(indices))))
        return Topology(
            indices=indices, links=tuple(links), nvlinks=tuple(nvlinks),
            cpu_affinity=tuple(x for t in tops for x in t.cpu_affinity), numa_node=numa,
            left_out=tuple(x for t in tops for x in t.left_out), unknown=tuple(x for t in tops for x in t.unknown),
            nvswitch=tuple(x for t in tops for x in (t.nvswitch or (False,) * len(t.indices))))

    def close(self) -> None:
        for part in reversed(self.parts):
            part.close()
