"""gpumon(1): made from the parser when the wheel is built, installed under share/man/man1, and read by man."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import require_tool

ROOT = Path(__file__).resolve().parent.parent


def _commands() -> list[str]:
    from gpumon.cli.manpage import _subparsers
    from gpumon.cli.parser import build_parser

    return [name for name, _, _ in _subparsers(build_parser())]


def test_the_wheel_carries_the_page_naming_every_command(tmp_path):
    # A copy of the tracked tree: the build's own files stay out of the checkout.
    tree = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    out = tmp_path / "wheel"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(tree)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = out.glob("gpumon-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".data/data/share/man/man1/gpumon.1")]
        page = archive.read(name).decode()
    assert page.startswith(".TH GPUMON 1")
    for command in _commands():
        assert f".SS {command.replace('-', chr(92) + '-')}" in page, command
    man = require_tool("man")
    path = tmp_path / "gpumon.1"
    path.write_text(page)
    shown = subprocess.run([man, "-l", str(path)], capture_output=True, text=True, timeout=60,
                           env={"PATH": "/usr/bin:/bin", "MANPAGER": "cat", "PAGER": "cat", "MANWIDTH": "100"})
    assert shown.returncode == 0 and shown.stderr == ""
    assert "EXIT STATUS" in shown.stdout and "doctor" in shown.stdout and "--nvml-lib" in shown.stdout
