"""GPU memory limits for jobs: every mechanism that exists, and which of them applied.

- JAX: XLA_PYTHON_CLIENT_MEM_FRACTION (and XLA_CLIENT_MEM_FRACTION) = limit / card total, no
  preallocation.
- TensorFlow: TF_FORCE_GPU_ALLOW_GROWTH=true (TensorFlow has no hard cap by environment).
- PyTorch: an import hook on the job's PYTHONPATH (gpumon/jobs/torch_hook) that sets the caching
  allocator's per-process memory fraction when CUDA initialises, so processes that never touch
  CUDA never create a context.
- CUDA MPS: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT when an MPS control daemon is reachable.
- The watchdog (the guarantee): the job's supervisor reads the job's GPU memory from NVML every
  sample and stops the job when it goes over: SIGTERM, then SIGKILL after a grace period.

Cgroup memory limits do not cap GPU memory, so they are not offered.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpumon.jobs.files import write_atomic
from gpumon.units import format_bytes

HOOK_DIR = Path(__file__).resolve().parent / "torch_hook"
MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"


def mps_reachable(env: dict[str, str] | None = None) -> bool:
    pipe_dir = (env or os.environ).get("CUDA_MPS_PIPE_DIRECTORY", MPS_PIPE_DEFAULT)
    return Path(pipe_dir, "control").exists()


def limit_environment(limit: int, card_totals: list[int], base_env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Variables to add for a job capped at `limit` bytes per card, and the mechanisms used."""
    total = min(card_totals) if card_totals else 0
    env: dict[str, str] = {}
    applied = ["watchdog"]
    if total > 0:
        fraction = f"{min(1.0, limit / total):.4f}"
        env.update({
            "XLA_PYTHON_CLIENT_MEM_FRACTION": fraction, "XLA_CLIENT_MEM_FRACTION": fraction,
            "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "GPUMON_TORCH_MEMORY_FRACTION": fraction,
            "PYTHONPATH": os.pathsep.join(p for p in (str(HOOK_DIR), base_env.get("PYTHONPATH", "")) if p),
        })
        applied += ["jax", "pytorch"]
    env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    applied.append("tensorflow (growth only)")
    if mps_reachable(base_env):
        mib = max(1, limit >> 20)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={mib}M" for i in range(len(card_totals)))
        applied.append("mps")
    return env, applied


def over_limit(used_per_card: dict[int, int], limit: int) -> str | None:
    """Why the job must stop, or None. The limit is per card: each card's memory of the job's
    processes is compared with it (a process on two cards counts on each with that card's memory)."""
    for index, used in sorted(used_per_card.items()):
        if used > limit:
            return f"memory limit exceeded on GPU {index}: {_binary(used)} > {_binary(limit)}"
    return None


def _binary(size: int) -> str:
    """'9.0 GiB', '512 MiB': the units spelled out in a record people read later."""
    short = format_bytes(size)
    return f"{short[:-1]} {short[-1]}iB" if short[-1] in "KMGT" else short


class CardLimits:
    """Default memory limit per card (by UUID), set with `m` in the TUI; used by launches there."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return ({str(k): int(v) for k, v in data.items() if isinstance(v, int) and v > 0}
                if isinstance(data, dict) else {})

    def get(self, uuid: str) -> int | None:
        return self.load().get(uuid)

    def set(self, uuid: str, limit: int | None) -> None:
        limits = self.load()
        if limit is None:
            limits.pop(uuid, None)
        else:
            limits[uuid] = limit
        write_atomic(self.path, json.dumps(limits, indent=1))
