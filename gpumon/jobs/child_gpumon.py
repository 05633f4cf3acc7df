"""The command line of a gpumon this gpumon starts (a job's supervisor, a `LocalHost`'s `gpumon run`,
`jobs --stop`, `signal`): the gpumon that is running now, never code from the working directory.

`python -m gpumon` puts the working directory first on `sys.path`, so a `gpumon.py` or a `gpumon/`
in a cloned project, a shared /tmp or a home directory would run instead of gpumon, with every job
launched from there. So the child runs with `-P` (no unsafe first entry: not the working directory)
and `-E` (PYTHONPATH, PYTHONHOME and the rest of PYTHON* are not read: a relative or hostile
PYTHONPATH imports nothing into it). The variables stay in its environment, so the job it starts
still gets them. The user site stays on (not `-I`): a `pip install --user gpumon` must still work, and
it is the user's own, not the directory's.

A gpumon that was itself imported from the working directory or from PYTHONPATH (a checkout) would not
be found under `-E -P`: its directory is then handed over, absolute, and put first on the child's path,
and so are PYTHONPATH's absolute entries (where a user's gpumon finds its own packages: a system
Python with a venv's site-packages on PYTHONPATH), never its relative ones nor the working directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import gpumon

# The child's own first lines when gpumon's directory is handed over: no file of the working directory
# is read before `sys.path` holds that directory.
_BOOT = ("import os, runpy, sys; roots, module = sys.argv[1:3]; del sys.argv[1:3]; "
         "sys.path[0:0] = roots.split(os.pathsep); runpy.run_module(module, run_name='__main__', alter_sys=True)")


def _root() -> Path:
    """The directory gpumon is imported from (the one holding the `gpumon` package)."""
    return Path(gpumon.__file__).resolve().parent.parent


def _handed_over(root: Path) -> list[str]:
    """What -E -P would lose and the child needs: this gpumon's directory when it came from the
    working directory or PYTHONPATH, and PYTHONPATH's absolute entries other than the working
    directory (in their order)."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the directory was removed under us: nothing can come from it
        cwd = Path("/")
    entries = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e]
    unsafe = {cwd} | {(cwd / e).resolve() for e in entries}
    kept = [str(Path(e).resolve()) for e in entries if os.path.isabs(e) and Path(e).resolve() != cwd]
    first = [str(root)] if root in unsafe else []
    return list(dict.fromkeys(first + kept))


def child_argv(module: str, args: Sequence[str] = ()) -> list[str]:
    """`python -m MODULE ARGS` for this very gpumon, safe from the directory it is started in."""
    roots = _handed_over(_root())
    if roots:
        return [sys.executable, "-E", "-P", "-c", _BOOT, os.pathsep.join(roots), module, *args]
    return [sys.executable, "-E", "-P", "-m", module, *args]
