"""The Slurm health-check script of docs/health.md, run as written (only gpumon's path and `scontrol`, a
stand-in that notes its arguments, replaced): it drains a node with a failing card, with a reason
whose first 20 characters (what `sinfo -R` shows) name the card and the code, and leaves a healthy
or merely warning node alone."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import Card

README = Path(__file__).resolve().parent.parent / "docs" / "health.md"
A100 = "NVIDIA A100-SXM4-80GB"
REMAPS = dict(remap_cor=0, remap_unc=0, remap_pending=0, remap_failure=0)


def the_script(tmp_path: Path) -> tuple[Path, Path]:
    text = README.read_text()
    script = re.search(r"```sh\n(#!/bin/sh\n# /etc/slurm/gpu-health\n.*?)```", text, re.S).group(1)
    gpumon = f"{shlex.quote(sys.executable)} -m gpumon"
    script = script.replace("/opt/gpumon/.venv/bin/gpumon", gpumon)
    path = tmp_path / "gpu-health"
    path.write_text(script)
    path.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    noted = tmp_path / "scontrol.args"
    stand_in = bin_dir / "scontrol"
    stand_in.write_text(f"#!/bin/sh\nfor arg; do printf '%s\\n' \"$arg\"; done > {shlex.quote(str(noted))}\n")
    stand_in.chmod(0o755)
    return path, noted


def run(fake_driver, script: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {**fake_driver.env, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}", **env}
    return subprocess.run(["/bin/sh", str(script)], env=environment, capture_output=True, text=True, timeout=90)


def test_it_drains_with_the_card_and_code_first(fake_driver, tmp_path):
    script, noted = the_script(tmp_path)
    fake_driver.machine.cards = [Card(A100, extra=REMAPS), Card(A100, extra={**REMAPS, "remap_pending": 1})]
    fake_driver.write()
    done = run(fake_driver, script, tmp_path, SLURMD_NODENAME="node07")
    assert done.returncode == 0, done.stderr
    args = noted.read_text().splitlines()
    assert args[:3] == ["update", "NodeName=node07", "State=DRAIN"]
    reason = args[3].removeprefix("Reason=")
    assert reason[:20] == "gpu1 remap_pending: "
    assert reason.startswith("gpu1 remap_pending: a row remap is pending") and len(reason) <= 120


def test_a_healthy_or_warning_node_is_left_alone(fake_driver, tmp_path):
    script, noted = the_script(tmp_path)
    fake_driver.machine.cards = [Card(A100, extra={**REMAPS, "mem_temp": 92, "mem_temp_max": 95})]  # warns
    fake_driver.write()
    done = run(fake_driver, script, tmp_path, SLURMD_NODENAME="node07")
    assert done.returncode == 0, done.stderr
    assert not noted.exists()
