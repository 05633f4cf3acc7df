"""Whether the Textual internals that gpumon's fast paths use are there, in the shape they were
written for.

The output layer (wire/driver.py; wire/updates.py through the app's `_display`), the lean
compositor (wire/compositor.py) and whole lines (widgets/unboxed_lines.py) use parts of Textual, and
one of Rich, that are not public API. pyproject.toml allows every Textual 8.x from the lowest one
tested, and pip installs the newest, which may have renamed or reshaped them. So each mechanism asks
`usable` before it is used: everything it needs must be there (by name; what it calls, with the
parameters it passes, by inspect.signature; what Textual sets on its objects, on the object). If
not, Textual's own way is taken for the run, and the log (GPUMON_LOG_FILE) says why in one line.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging

log = logging.getLogger(__name__)

# Per mechanism: (module, class, attribute, the parameters it is called with, first to last; None:
# only read; a last "..." : gpumon receives the call and passes on whatever follows).
Need = tuple[str, str, str, tuple[str, ...] | None]
_COMPOSITOR, _STYLES_CACHE, _APP = "textual._compositor", "textual._styles_cache", "textual.app"
_CHOPS = (_COMPOSITOR, "ChopsUpdate", "__init__", ("self", "chops", "spans", "chop_ends"))
NEEDS: dict[str, tuple[Need, ...]] = {
    "lean compositor": (
        (_COMPOSITOR, "Compositor", "render_partial_update", ("self",)),
        (_COMPOSITOR, "Compositor", "_regions_to_spans", ("regions",)),
        (_COMPOSITOR, "Compositor", "cuts", None),
        (_COMPOSITOR, "Compositor", "visible_widgets", None),
        _CHOPS,
        ("textual.widget", "Widget", "render_lines", ("self", "crop")),
        ("textual.strip", "Strip", "divide", ("self", "cuts")),
    ),
    "whole lines": (
        (_STYLES_CACHE, "StylesCache", "render_widget", ("self", "widget", "crop")),
        (_STYLES_CACHE, "StylesCache", "render_line", ("self", "styles", "y", "size", "content_size", "padding",
                                                       "base_background", "background", "render_content_line", "...")),
    ),
    "output layer": (
        ("textual.drivers.linux_driver", "LinuxDriver", "_get_terminal_size", ("self",)),
        ("textual.drivers.linux_driver", "LinuxDriver", "start_application_mode", ("self",)),
        ("textual.drivers.linux_driver", "LinuxDriver", "stop_application_mode", ("self",)),
        ("textual.drivers.linux_driver", "LinuxDriver", "write", ("self", "data")),
        ("textual.drivers.linux_driver", "LinuxDriver", "flush", ("self",)),
        ("textual.drivers.linux_driver", "LinuxDriver", "process_message", ("self", "message")),
    ),
    "quiet input": (
        ("textual.drivers.linux_driver", "LinuxDriver", "run_input_thread", ("self",)),
        ("textual.drivers.linux_driver", "LinuxDriver", "process_message", ("self", "message")),
        ("textual._xterm_parser", "XTermParser", "__init__", ("self", "debug")),
        ("textual._parser", "Parser", "feed", ("self", "data")),
        ("textual._parser", "Parser", "tick", ("self",)),
        ("textual._parser", "ParseError", "__init__", None),
        ("textual._time", "get_time", "__call__", None),
    ),
    "compositor updates as cells": (
        (_APP, "App", "_display", ("self", "screen", "renderable")),
        (_APP, "App", "_begin_update", ("self",)),
        (_APP, "App", "_end_update", ("self",)),
        (_APP, "App", "_handle_exception", ("self", "error")),
        (_APP, "App", "post_display_hook", ("self",)),
        _CHOPS,
        (_COMPOSITOR, "LayoutUpdate", "__init__", ("self", "strips", "region")),
        ("textual.strip", "Strip", "render_ansi", ("style", "color_system")),
        ("rich.style", "Style", "_ansi", None),
    ),
}
_said: set[str] = set()


def usable(mechanism: str, instance: object = None, *attributes: str) -> bool:
    """Whether `mechanism` may be used: what it needs of Textual's classes, and `attributes` (dotted
    paths) of `instance`, an object Textual made. If not, the reason is logged, once a run."""
    problem = _class_problem(mechanism) or _instance_problem(instance, attributes)
    if problem is None:
        return True
    if mechanism not in _said:
        _said.add(mechanism)
        log.info("Textual %s: %s: %s off for this run, Textual's own way instead",
                 _textual_version(), problem, mechanism)
    return False


@functools.cache
def _class_problem(mechanism: str) -> str | None:
    for need in NEEDS[mechanism]:
        if problem := _need_problem(*need):
            return problem
    return None


def _need_problem(module: str, owner: str, name: str, params: tuple[str, ...] | None) -> str | None:
    where = f"{module}.{owner}"
    try:
        cls = getattr(importlib.import_module(module), owner)
    except (ImportError, AttributeError):
        return f"{where} is missing"
    try:
        inspect.getattr_static(cls, name)
    except AttributeError:
        return f"{where}.{name} is missing"
    if params is None:
        return None
    try:
        signature = inspect.signature(getattr(cls, name))
    except (TypeError, ValueError):
        return f"{where}.{name} has no signature to check"
    found = tuple(signature.parameters)
    passed_on = params[-1:] == ("...",)
    params = params[:-1] if passed_on else params
    more = list(signature.parameters.values())[len(params):]
    # What gpumon passes, in order, and (unless it passes on the rest) nothing more that must be passed.
    if found[:len(params)] != params or not passed_on and any(
            p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in more):
        return f"{where}.{name} takes ({', '.join(found)}), not ({', '.join(params)}{', ...' * passed_on})"
    return None


def _instance_problem(instance: object, attributes: tuple[str, ...]) -> str | None:
    for path in attributes:
        value = instance
        for name in path.split("."):
            try:
                value = getattr(value, name)
            except AttributeError:
                return f"{type(instance).__name__} objects have no {path}"
    return None


def _textual_version() -> str:
    # Here, not at the top: importlib.metadata brings email, zipfile and csv (~3 MiB) to every run.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("textual")
    except PackageNotFoundError:
        return "(version unknown)"


def forget() -> None:
    """Check again (tests that change Textual)."""
    _class_problem.cache_clear()
    _said.clear()
