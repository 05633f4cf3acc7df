"""Where samples come from: the real driver (nvml), a simulation (demo), or a recording (replay).

Every backend satisfies `Backend`; `open_backend` picks one from the command-line options.
"""

from __future__ import annotations

from typing import Protocol

from gpumon.model import Snapshot, Topology


class Backend(Protocol):
    name: str
    # True when process pids are real pids on this host, so psutil may enrich them.
    real_pids: bool

    def sample(self) -> Snapshot:
        """One reading of every card. May block (it runs in a worker thread); never raises for a
        single card's trouble: that card's state says so."""

    def topology(self) -> Topology:
        """Links between cards, CPU affinity and NUMA node per card."""

    def close(self) -> None: ...


def open_backend(
    demo: str | None = None,
    replay: str | None = None,
    nvml_lib: str | None = None,
    seed: int = 0,
) -> Backend:
    # Imported on demand: --demo and --replay never load the NVML bindings, and the reverse.
    if demo is not None:
        from gpumon.monitor.backends.demo import DemoBackend

        return DemoBackend(scenario=demo, seed=seed)
    if replay is not None:
        from gpumon.monitor.backends.replay import ReplayBackend

        return ReplayBackend(replay)
    from gpumon.monitor.backends.nvml import NvmlBackend

    return NvmlBackend(lib_path=nvml_lib)
