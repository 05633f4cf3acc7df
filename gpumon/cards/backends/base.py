"""What every backend is: `Backend`, an abstract base class whose defaults say what a backend
without an ability does, so callers call the method and never ask whether it is there.

A backend must read its cards (`sample`), their links (`topology`) and say its `name`; the rest
has a default:
- deadlines: `sample_within` / `topology_within` take one where cards answer on lanes of their own
  (NVML, DRM: `PerCardBackend`); others read everything at once and ignore it;
- `ask` / `collect`: a sample in two halves, so a composite can ask every part before waiting for any;
- `identity`: the cards' names before the first sample (None: nothing faster than a sample);
- `wait_xid`: XID events (`xid_events` says whether any can come; the default waits and has none);
- `health_baseline`: the tracker whose readings a one-off `gpumon health` keeps between runs;
- `pci_paths`, `index_count`: what a composite needs to number and link several backends' cards;
- `open_here`: how a backend that reads this machine's cards opens (backends/__init__.py's registry).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpumon.errors import NoDriverError
from gpumon.health.rules import HealthSettings
from gpumon.model import Snapshot, Topology

if TYPE_CHECKING:
    from gpumon.health.history import HealthTracker

NO_CARDS_HINT = "try `gpumon --demo` to see simulated GPUs"


@dataclass(frozen=True)
class Machine:
    """Where a backend finds this machine's cards (options and config)."""

    nvml_lib: str | None = None
    sysfs: str = "/sys"
    procfs: str = "/proc"
    health: HealthSettings = HealthSettings()  # the config's [health]: the verdict's rules, how often counters are read


class Backend(ABC):
    name: str
    # True when process pids are real pids on this host, so psutil may enrich them.
    real_pids: bool = True
    # Where its processes' /proc is (a host's mounted elsewhere); None: this process's own.
    procfs: str | None = None
    # Whether wait_xid can ever report an XID: listeners start a thread only for those that can.
    xid_events: bool = False

    @abstractmethod
    def sample(self) -> Snapshot:
        """One reading of every card. May block (it runs in a worker thread); never raises for a
        single card's trouble: that card's state says so."""

    @abstractmethod
    def topology(self) -> Topology:
        """Links between cards, CPU affinity and NUMA node per card."""

    def close(self) -> None:
        """Nothing to let go of, by default."""

    @classmethod
    def open_here(cls, machine: Machine, first_index: int = 0) -> Backend:
        """This machine's cards of this backend, numbered from `first_index`; NoDriverError (its
        words, without NO_CARDS_HINT) when there are none. Only backends that read a machine's
        cards (the ones vendors name) open this way."""
        raise NoDriverError(f"the {cls.__name__} backend does not read this machine's cards")

    def sample_within(self, wait_s: float | None = None) -> Snapshot:
        """sample(), waiting up to `wait_s` for slow cards where cards answer on their own."""
        return self.sample()

    def topology_within(self, wait_s: float | None = None,
                        on_progress: Callable[[Topology], None] | None = None) -> Topology:
        """topology(), with a deadline and the matrix so far (`on_progress`) where cards answer on their own."""
        return self.topology()

    def ask(self, deadline: float) -> None:
        """Start a sample that `collect` finishes: nothing to start ahead, by default."""

    def collect(self, deadline: float) -> Snapshot:
        """The cards as they stand at `deadline` (monotonic clock)."""
        return self.sample_within(max(0.0, deadline - time.monotonic()))

    def identity(self, wait_s: float) -> Snapshot | None:
        """The cards' names and ids without values, for a first frame; None: the first sample brings them."""
        return None

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        """Block up to `timeout_s` for XID errors: (card index, XID) pairs. None come from here."""
        time.sleep(max(0.0, timeout_s))
        return []

    def health_baseline(self) -> HealthTracker | None:
        """The tracker whose counter readings `gpumon health` keeps between runs; None: none kept."""
        return None

    def index_count(self) -> int:
        """How many card indices it uses: the next backend of a composite numbers on from there."""
        return 0

    def pci_paths(self, sysfs: str) -> dict[int, Sequence[str]]:
        """Each card's PCIe path (drm/topology.pci_path) under `sysfs`, for links to other backends' cards."""
        return {}


class PerCardBackend(Backend):
    """A backend whose cards answer on lanes of their own (backends/lanes.py): `sample` and
    `topology` take the deadline, and a card that misses it is reported as it stands."""

    @abstractmethod
    def sample(self, wait_s: float | None = None) -> Snapshot: ...

    @abstractmethod
    def topology(self, wait_s: float | None = None,
                 on_progress: Callable[[Topology], None] | None = None) -> Topology: ...

    def sample_within(self, wait_s: float | None = None) -> Snapshot:
        return self.sample(wait_s=wait_s)

    def topology_within(self, wait_s: float | None = None,
                        on_progress: Callable[[Topology], None] | None = None) -> Topology:
        return self.topology(wait_s=wait_s, on_progress=on_progress)
