"""Where samples come from: this machine's cards (nvml, drm), a simulation (demo), or a recording
(replay); several of them as one (composite).

Every backend is a `Backend` (base.py). The registry below names them (as Harlequin's adapters
are found by name); each is a module exposing `BACKEND`, imported only when asked for, so
--demo and --replay never load the NVML bindings, and the reverse. `open_backend` picks one from
the command-line options: for this machine, every backend a vendor's record names
(gpumon/vendors.py), in the vendors' order, each numbering its cards after the last.
"""

from __future__ import annotations

import importlib

from gpumon.cards.backends.base import NO_CARDS_HINT, Backend, Machine, PerCardBackend
from gpumon.errors import NoDriverError
from gpumon.health.rules import HealthSettings
from gpumon.vendors import vendors

__all__ = ["NO_CARDS_HINT", "Backend", "Machine", "PerCardBackend", "backend_class", "open_backend",
           "register_backend", "unregister_backend"]

# name -> the module whose BACKEND it is. A name not here is looked for as gpumon.cards.backends.<name>.
_BACKENDS: dict[str, str] = {
    "nvml": "gpumon.cards.backends.nvml",
    "drm": "gpumon.cards.backends.drm",
    "demo": "gpumon.cards.backends.demo",
    "replay": "gpumon.cards.backends.replay",
}


def register_backend(name: str, module: str) -> None:
    """Name a backend: `module` exposes BACKEND, a Backend subclass."""
    _BACKENDS[name] = module


def unregister_backend(name: str) -> None:
    _BACKENDS.pop(name, None)


def _module(name: str):
    return importlib.import_module(_BACKENDS.get(name, f"{__name__}.{name}"))


def backend_class(name: str) -> type[Backend]:
    return _module(name).BACKEND


def machine_backends() -> list[str]:
    """The backends that read this machine's cards: those the vendors name, in the vendors' order."""
    return list(dict.fromkeys(v.backend for v in vendors() if v.backend))


def open_backend(
    demo: str | None = None,
    replay: str | None = None,
    nvml_lib: str | None = None,
    seed: int = 0,
    sysfs: str | None = None,
    procfs: str | None = None,
    health: HealthSettings = HealthSettings(),
) -> Backend:
    """The demo, a recording, or this machine's cards: NVIDIA's through NVML, AMD's and Intel's
    through the kernel (`sysfs`, `procfs`: where /sys and /proc are). NoDriverError (exit 3) only
    when no vendor has a card here. `health`: the config's [health], for every card's verdict."""
    if demo is not None:
        return backend_class("demo")(scenario=demo, seed=seed, health=health)  # type: ignore[call-arg]
    if replay is not None:
        return backend_class("replay")(replay)  # type: ignore[call-arg]
    return open_machine(Machine(nvml_lib=nvml_lib, sysfs=sysfs or "/sys", procfs=procfs or "/proc", health=health))


def open_machine(machine: Machine, names: list[str] | None = None) -> Backend:
    """Every backend of `names` (default: machine_backends()) that finds cards here, as one."""
    opened: list[Backend] = []
    missing: list[str] = []
    for name in machine_backends() if names is None else names:
        module = _module(name)
        # A backend module may say cheaply that this machine has none of its cards (drm: one
        # listing of /sys/class/drm), so that a start does not import its readers for nothing.
        absent = getattr(module, "absent_here", None)
        if absent is not None and (why := absent(machine)) is not None:
            missing.append(why)
            continue
        try:
            part = module.BACKEND.open_here(machine, first_index=sum(p.index_count() for p in opened))
        except NoDriverError as exc:
            missing.append(str(exc).removesuffix(f"; {NO_CARDS_HINT}"))
            continue
        opened.append(part)
    if not opened:
        raise NoDriverError(f"{', and '.join(missing)}; {NO_CARDS_HINT}") from None
    if len(opened) == 1:
        return opened[0]
    from gpumon.cards.backends.composite import CompositeBackend

    return CompositeBackend(opened, sysfs=machine.sysfs)
