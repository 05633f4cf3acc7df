"""Python with one Textual internal changed as a newer Textual might change it, Textual itself
consistently so (it keeps working), gpumon not (it was written for the old one):

    python tests/textual_changed.py CHANGE [-m MODULE | SCRIPT] [ARG...]

CHANGE is `rename:NAME`: the attribute NAME is called NAME_renamed in every class of Textual that
has it and in every access to it in Textual's code (methods, instance attributes), or
`reshape:MODULE.CLASS.METHOD`: the method takes `(self, *args, **kwargs)` and passes them on.
"""

from __future__ import annotations

import functools
import importlib
import runpy
import sys
from types import CodeType, FunctionType


def _renamed_code(code: CodeType, old: str, new: str) -> CodeType:
    consts = tuple(_renamed_code(c, old, new) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_names=tuple(new if n == old else n for n in code.co_names), co_consts=consts)


def _functions_of(value: object):
    """The plain functions behind a class attribute (methods, properties, cached and wrapped ones)."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, property):
        for accessor in (value.fget, value.fset, value.fdel):
            yield from _functions_of(accessor)
    elif isinstance(value, functools.partial):
        yield from _functions_of(value.func)
    elif isinstance(value, FunctionType):
        yield value
        yield from _functions_of(getattr(value, "__wrapped__", None))
    elif hasattr(value, "__wrapped__"):  # functools.lru_cache and the like
        yield from _functions_of(value.__wrapped__)


def rename(old: str) -> None:
    new = old + "_renamed"
    # Everything of Textual that gpumon's app will load, before it is changed.
    import textual.drivers.headless_driver  # noqa: F401
    import textual.drivers.linux_driver  # noqa: F401

    import gpumon.tui.app  # noqa: F401
    import gpumon.tui.fleet.app  # noqa: F401

    modules = [m for name, m in list(sys.modules.items()) if name.split(".")[0] == "textual" and m is not None]
    seen: set[int] = set()

    def patch(value: object) -> None:
        for function in _functions_of(value):
            if id(function) not in seen:
                seen.add(id(function))
                function.__code__ = _renamed_code(function.__code__, old, new)

    for module in modules:
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == module.__name__:
                classes = [value]
                while classes:
                    cls = classes.pop()
                    for attribute in list(vars(cls).values()):
                        if isinstance(attribute, type) and attribute.__qualname__.startswith(cls.__qualname__):
                            classes.append(attribute)
                        patch(attribute)
                    if old in vars(cls):
                        setattr(cls, new, vars(cls)[old])
                        delattr(cls, old)
            elif getattr(value, "__module__", None) == module.__name__:
                patch(value)


def reshape(path: str) -> None:
    module, owner, name = path.rsplit(".", 2)
    cls = getattr(importlib.import_module(module), owner)
    original = getattr(cls, name)

    def passed_on(self, *args, **kwargs):
        return original(self, *args, **kwargs)

    setattr(cls, name, passed_on)


def main() -> None:
    change, *rest = sys.argv[1:]
    kind, _, what = change.partition(":")
    {"rename": rename, "reshape": reshape}[kind](what)
    if rest[:1] == ["-m"]:
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main()
