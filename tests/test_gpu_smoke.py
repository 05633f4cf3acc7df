"""scripts/gpu-smoke runs its checks on the fake driver when there is no GPU, so it is tested."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu-smoke"


def test_gpu_smoke_passes_on_the_fake_driver(tmp_path, build_fake):
    build_fake()  # skips (or fails in CI) without a C compiler
    out = tmp_path / "smoke"
    result = subprocess.run([sys.executable, str(SCRIPT), str(out), "--fake"], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = (out / "report.txt").read_text()
    assert "FAIL" not in report and "checks passed" in report
    for artefact in ("snapshot.json", "nvidia-smi.csv", "topo.txt", "job.json", "watch.jsonl", "tui.svg",
                     "health.json", "nvidia-smi-q.txt"):
        assert (out / artefact).exists(), artefact


def test_gpu_smoke_without_arguments_prints_usage():
    result = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "OUTDIR" in result.stdout
