"""Snapshots read back from a recording (`--record FILE`, see cards/recording.py), played at the
sampler's pace with pause, step and speed controls. A file with no readable snapshot at all is a
usage error."""

from __future__ import annotations

from gpumon.cards.backends.base import Backend
from gpumon.cards.recording import read_recording
from gpumon.errors import UsageError
from gpumon.model import Snapshot, Topology


class ReplayBackend(Backend):
    name = "replay"
    real_pids = False

    def __init__(self, path: str) -> None:
        self.path = path
        self.snapshots = list(read_recording(path))
        if not self.snapshots:
            raise UsageError(f"recording {path} holds no readable snapshot")
        self.position = 0
        self.paused = False
        self._steps = 0  # steps asked for while paused

    @property
    def finished(self) -> bool:
        return self.position >= len(self.snapshots)

    def step(self) -> None:
        """While paused: let the next sample advance by one snapshot."""
        self._steps += 1

    def sample(self) -> Snapshot:
        """The next recorded snapshot; while paused, or at the end, the current one again."""
        if self.paused and self._steps == 0 and self.position > 0:
            return self.snapshots[min(self.position, len(self.snapshots)) - 1]
        self._steps = max(0, self._steps - 1)
        snapshot = self.snapshots[min(self.position, len(self.snapshots) - 1)]
        self.position = min(self.position + 1, len(self.snapshots))
        return snapshot

    def topology(self) -> Topology:
        gpus = self.snapshots[0].gpus
        n = len(gpus)
        return Topology(
            indices=tuple(g.index for g in gpus),
            links=tuple(tuple("X" if i == j else None for j in range(n)) for i in range(n)),
            nvlinks=tuple(tuple(0 for _ in range(n)) for _ in range(n)),
            cpu_affinity=tuple(g.cpu_affinity for g in gpus),
            numa_node=tuple(g.numa_node for g in gpus),
        )


BACKEND = ReplayBackend
