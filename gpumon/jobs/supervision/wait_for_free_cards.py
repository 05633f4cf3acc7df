"""A queued job's turn, or a move's: the cards its spec asks for, once they have been free (and
nobody else's claim) for a few samples in a row, so a card freed for a moment is not taken."""

from __future__ import annotations

import os

from gpumon.errors import GpumonError
from gpumon.jobs.claims_and_queue import CardsTaken, SupervisorSharing
from gpumon.jobs.placement import allocated_elsewhere, free_enough, outside_allocation, resolve_spec
from gpumon.model import Snapshot, Topology
from gpumon.owners.slurm_gres import SlurmGres, with_allocations

FREE_SAMPLES_IN_A_ROW = 3


class FreeCardsWait:
    def __init__(self, gpu_spec: str, topo: Topology, min_free: str | None, max_util: float | None,
                 sharing: SupervisorSharing) -> None:
        self.gpu_spec, self.topo, self.min_free, self.max_util = gpu_spec, topo, min_free, max_util
        self.sharing = sharing  # says what the job waits for (`gpumon queue`, J)
        self.streak: tuple[tuple[str, ...], int] = ((), 0)
        self.slurm = SlurmGres()  # on a Slurm node: the cards it has given its jobs

    def pick(self, taken: CardsTaken, snapshot: Snapshot):
        """The cards, on the queue's turn (`taken`: cards claimed by others, and the user's own
        reserved ones), once free FREE_SAMPLES_IN_A_ROW samples in a row; else None."""
        # Auto chooses within the launcher's allocation (a card named by hand waits for that card).
        outside = outside_allocation(snapshot, os.environ) if self.gpu_spec.strip().startswith("auto") else {}
        # Never a card Slurm has given another job, auto or named (a queued job waits for it).
        allocated = allocated_elsewhere(with_allocations(snapshot, self.slurm, SlurmGres.TIMEOUT_S), os.environ)
        skip = {**outside, **allocated, **taken.skip}
        try:
            gpus = resolve_spec(self.gpu_spec, snapshot, self.topo, self.min_free, self.max_util, None,
                                skip, taken.mine)
            free = all(free_enough(g, self.min_free, self.max_util) is None and g.ref not in skip for g in gpus)
            self.sharing.waiting_for = "" if free else "its cards are not free"
        except GpumonError as exc:
            gpus, free = [], False
            self.sharing.waiting_for = str(exc).removeprefix(f"--gpu {self.gpu_spec}: ")
        uuids = tuple(g.uuid for g in gpus)
        count = self.streak[1] + 1 if free and uuids == self.streak[0] else (1 if free else 0)
        self.streak = (uuids, count)
        return gpus if count >= FREE_SAMPLES_IN_A_ROW else None
