"""The package's shape: layers that only import downwards, no Textual below the views, no NVML
outside its backend, small modules, and a command line that never touches the user's command."""

from __future__ import annotations

import ast
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from import_graph import cycles, import_graph, module_files

import gpumon
from gpumon.cards.backends.demo import SCENARIOS
from gpumon.cli.parser import DEMO_SCENARIOS, build_parser, normalise_argv

PACKAGE = Path(gpumon.__file__).parent
# A soft limit: a module past it is split where its meaning splits, or listed here with the reason
# it stays whole (reviewed, not a quota to meet).
SOFT_MODULE_LINES = 400
LONG_BY_DESIGN = {
    "cli/parser.py": "the command line's whole grammar, one argparse tree read top to bottom",
    "jobs/supervision/supervisor.py": "one job's life from start to record, read in the order it happens",
    "tui/widgets/gpu_panel.py": "one card's panel at every size: what each width shows is compared side by side",
    "tui/screens/main.py": "the main screen: what it composes and how a reading reaches each of its parts",
    "fleet/schema.py": "every check of a document from another host, in the order of the document",
}


def test_import_contracts_hold():
    """Layers, no Textual in the data layer, NVML only in its backend (contracts in pyproject.toml)."""
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], capture_output=True, text=True, cwd=PACKAGE.parent)
    assert result.returncode == 0, result.stdout[-3000:]


def test_no_textual_when_every_headless_module_is_imported():
    modules = [m.name for m in pkgutil.walk_packages([str(PACKAGE)], "gpumon.")
               if not m.name.startswith("gpumon.tui") and m.name not in ("gpumon.cli.tui", "gpumon.__main__")
               and "sitecustomize" not in m.name]
    assert "gpumon.cards.sampler" in modules and "gpumon.alerting.watch" in modules
    code = f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\nprint('textual' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_no_import_cycles_anywhere():
    """Not in the package, counting imports inside functions (which import-linter's layers cannot
    see within one layer), and not among the benchmark scripts."""
    found = cycles(import_graph(module_files(PACKAGE, "gpumon")))
    found += cycles(import_graph(module_files(PACKAGE.parent / "benchmarks", "")))
    assert found == [], f"import cycles: {found}"


def test_no_module_imports_back_even_for_annotations():
    """A module that names, for its annotations only, the module that imports it is still a circle
    to whoever reads them: the two can be understood only together."""
    found = cycles(import_graph(module_files(PACKAGE, "gpumon"), typing=True))
    assert found == [], f"import cycles through annotations: {found}"


def test_the_cycle_finder_finds_one(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    import b\n")
    (tmp_path / "b.py").write_text("from a import f\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    assert cycles(import_graph(module_files(tmp_path, ""))) == [["a", "b"]]
    (tmp_path / "d.py").write_text("import c\n")
    (tmp_path / "a.py").write_text("import d\n")  # a -> d -> c, and c -> a for annotations only
    assert cycles(import_graph(module_files(tmp_path, ""))) == []
    assert cycles(import_graph(module_files(tmp_path, ""), typing=True)) == [["a", "c", "d"]]


def test_design_names_every_package():
    """docs/design.md's table of packages is the tree's list of packages, no more and no less."""
    table = (PACKAGE.parent / "docs" / "design.md").read_text().split("## The package, by concern", 1)[1]
    named = set(re.findall(r"^\| `([a-z_/]+/)` \|", table, flags=re.M))
    tree = {str(p.parent.relative_to(PACKAGE)) + "/" for p in PACKAGE.rglob("*.py")
            if p.parent != PACKAGE and p.name in ("__init__.py", "sitecustomize.py")}
    assert named == tree | {"gpumon/"}


def test_long_modules_are_the_reviewed_ones():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > SOFT_MODULE_LINES}
    unreviewed = {path: n for path, n in long.items() if path not in LONG_BY_DESIGN}
    assert not unreviewed, f"split these where their meaning splits, or list them in LONG_BY_DESIGN: {unreviewed}"
    assert set(LONG_BY_DESIGN) <= set(long), "no longer long: take them off LONG_BY_DESIGN"


# Process state, not settings: whether the splash is up, the one thread that starts ssh children.
GLOBALS_OF_PROCESS_STATE = {"cli/splash.py": {"_up"}, "remote/children.py": {"_spawner"}}


def test_no_module_keeps_configuration_in_a_global():
    """Settings are one value the command line builds and hands down: a module that assigns a
    global makes every reader depend on who configured last (on a shared host, on whose config)."""
    assigned = {}
    for path in PACKAGE.rglob("*.py"):
        names = {name for node in ast.walk(ast.parse(path.read_text(), str(path)))
                 if isinstance(node, ast.Global) for name in node.names}
        if names:
            assigned[str(path.relative_to(PACKAGE))] = names
    assert assigned == GLOBALS_OF_PROCESS_STATE


def _code_files() -> list[Path]:
    root = PACKAGE.parent
    return [p for folder in ("gpumon", "tests", "benchmarks", "scripts") for p in (root / folder).rglob("*.py")
            if "__pycache__" not in p.parts]


def test_no_statement_follows_a_return_or_raise():
    """Dead code reads as if it ran."""
    dead = []
    for path in _code_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for body in (getattr(node, name, None) for name in ("body", "orelse", "finalbody")):
                if isinstance(body, list):
                    dead += [f"{path}:{after.lineno}" for before, after in zip(body, body[1:])
                             if isinstance(before, (ast.Return, ast.Raise, ast.Continue, ast.Break))]
    assert dead == []


def test_no_comment_names_a_tracker_issue():
    """Comments and docstrings say why in their own words: an issue number means nothing to a reader."""
    named = [f"{path}:{n}" for path in _code_files()
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"\b[Ii]ssues? ?#?\d+\b", line)]
    assert named == []


def test_no_module_reaches_for_another_modules_private_names():
    """A name another module needs is public; `_name` stays inside its module."""
    reaching = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpumon"):
                reaching += [f"{path.relative_to(PACKAGE.parent)}: {node.module}.{a.name}" for a in node.names
                             if a.name.startswith("_") and not a.name.startswith("__")]
    assert reaching == []


def test_every_package_is_installed():
    """pyproject.toml lists the packages (the themes folder is mapped in): a new subpackage left out
    of the list would work in the editable install the tests use and be missing from `pip install .`."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


def test_the_parser_knows_the_demo_scenarios():
    assert DEMO_SCENARIOS == tuple(SCENARIOS)


@pytest.mark.parametrize("argv, expected", [
    (["run", "--", "python", "sim.py", "--demo"], ["run", "--", "python", "sim.py", "--demo"]),
    (["run", "--gpu", "1", "python", "sim.py", "--demo", "hot"],
     ["run", "--gpu", "1", "python", "sim.py", "--demo", "hot"]),
    (["run", "--demo", "--", "python", "x.py", "--demo=lost"],
     ["run", "--demo", "--", "python", "x.py", "--demo=lost"]),
    (["--demo", "hot"], ["--demo", "--scenario", "hot"]),
    (["--demo", "snapshot"], ["--demo", "snapshot"]),
    (["snapshot", "--demo=lost", "--json"], ["snapshot", "--demo", "--scenario", "lost", "--json"]),
    (["run", "--name", "--demo", "python", "--demo", "lost"], ["run", "--name", "--demo", "python", "--demo", "lost"]),
])
def test_only_gpumons_own_options_are_rewritten(argv, expected):
    assert normalise_argv(argv, build_parser()) == expected


def test_run_keeps_the_command_byte_for_byte():
    parser = build_parser()
    argv = ["run", "--gpu", "0", "--", "python", "sim.py", "--demo", "--interval", "5", "--", "x"]
    args = parser.parse_args(normalise_argv(argv, parser))
    assert args.command == ["--", "python", "sim.py", "--demo", "--interval", "5", "--", "x"]
