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
    sysfs: str | None = None,
    procfs: str | None = None,
) -> Backend:
    """The demo, a recording, or this machine's cards: NVIDIA's through NVML, AMD's and Intel's
    through the kernel (`sysfs`, `procfs`: where /sys and /proc are). NoDriverError (exit 3) only
    when no vendor has a card here."""
    # Imported on demand: --demo and --replay never load the NVML bindings, and the reverse.
    if demo is not None:
        from gpumon.cards.backends.demo import DemoBackend

        return DemoBackend(scenario=demo, seed=seed)
    if replay is not None:
        from gpumon.cards.backends.replay import ReplayBackend

        return ReplayBackend(replay)
    from gpumon.cards.backends.drm import DrmBackend
    from gpumon.cards.backends.nvml import NO_DRIVER_HINT, NvmlBackend
    from gpumon.errors import NoDriverError

    try:
        nvml, no_nvidia = NvmlBackend(lib_path=nvml_lib), None
    except NoDriverError as exc:
        nvml, no_nvidia = None, exc
    drm = DrmBackend(sysfs=sysfs or "/sys", procfs=procfs or "/proc", first_index=len(nvml.cards) if nvml else 0)
    if not drm.cards:
        if nvml is None:
            assert no_nvidia is not None
            said = str(no_nvidia).removesuffix(f"; {NO_DRIVER_HINT}")
            raise NoDriverError(f"{said}, and no AMD or Intel GPU under {drm.sysfs}/class/drm; {NO_DRIVER_HINT}") \
                from None
        return nvml
    if nvml is None:
        return drm
    from gpumon.cards.backends.composite import CompositeBackend

    return CompositeBackend(nvml, drm)
