"""AMD and Intel cards through the kernel: sysfs for the cards, /proc/PID/fdinfo for their processes.

One small reader per kernel file, each returning a typed record: `sysfs` (finding the cards),
`hwmon`, `amdgpu`, `intel`, `fdinfo` (the clients), `names` (pci.ids), `topology` (PCIe paths,
xGMI); `backend` turns them into samples. Roots are options (`--path.sysfs`, `--path.procfs`), so the
same code reads a host's /sys and /proc mounted in a container, and the tests' fake trees.

Every start asks this backend whether the machine has such cards; most have none. So the package
itself stays light: `absent_here` answers from one listing of /sys/class/drm, and the readers
(`BACKEND`) are imported when first named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpumon.cards.backends.base import Machine
    from gpumon.cards.backends.drm.backend import BACKEND, DrmBackend

__all__ = ["BACKEND", "DrmBackend", "absent_here"]


def absent_here(machine: Machine) -> str | None:
    """Why this machine has no AMD or Intel card to read (as `open_here` would say it); None: it has some."""
    from gpumon.cards.backends.drm.kinds import no_cards
    from gpumon.cards.backends.drm.sysfs import find_cards

    return None if find_cards(machine.sysfs) else no_cards(machine.sysfs)


def __getattr__(name: str) -> Any:
    if name in ("BACKEND", "DrmBackend"):
        from gpumon.cards.backends.drm import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
