"""Build step: gpumon(1) is written from the argument parser into build/man/ and installed by the
wheel under share/man/man1/ (everything else is in pyproject.toml)."""

import sys
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
PAGE = Path("build") / "man" / "gpumon.1"


def write_manpage() -> str:
    sys.path.insert(0, str(HERE))
    try:
        from gpumon.cli.manpage import manpage
        from gpumon.cli.parser import build_parser
    finally:
        sys.path.remove(str(HERE))
    (HERE / PAGE).parent.mkdir(parents=True, exist_ok=True)
    (HERE / PAGE).write_text(manpage(build_parser()), encoding="utf-8")
    return PAGE.as_posix()


setup(data_files=[("share/man/man1", [write_manpage()])])
