"""The scenario every benchmark measures: cards of the fake driver with moving values and the given
processes, and the environment that points a gpumon at it. Shared by bench.py and the benchmarks
it runs (web_viewers.py, ui_cycle.py), so none of them imports another.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenvml import GIB, Card, FakeMachine  # noqa: E402

CARD_NAME = "NVIDIA H100 80GB HBM3"


def machine(cards: int, pids: list[int], slow_ms: int = 0) -> FakeMachine:
    m = FakeMachine(
        cards=[Card(CARD_NAME, mem_total=80 * GIB, extra=dict(util="10..95", temp="35..80",
                                                              power_mw="100000..650000", power_limit_mw=700000,
                                                              clock_sm=1980, clock_mem=2619, fan=40))
               for _ in range(cards)],
        procs=[dict(gpu=i % cards, pid=pid, mem=GIB, sm="0..60") for i, pid in enumerate(pids)],
    )
    if slow_ms:
        m.delays = {"nvmlDeviceGetUtilizationRates": slow_ms}
    return m


def env_for(lib_dir: Path, config: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "GPUMON_NVML_LIB")}
    env.update(TERM="xterm-256color", FAKE_NVML_CONFIG=str(config), LD_LIBRARY_PATH=str(lib_dir),
               PYTHONPATH=str(ROOT))
    env.pop("COLORTERM", None)
    return env
