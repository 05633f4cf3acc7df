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

The limit is per card. A job's own (`--mem-limit`, the run dialog's) applies on each of its cards;
without one, each card it lands on brings its own default (`m` in the TUI: `CardLimits`), whatever
put the job there: the SPEC, auto placement, a queue, a failover move (`limits_for`). The
in-program caps are one fraction per process, so they take the strictest of the cards' shares.

Cgroup memory limits do not cap GPU memory, so they are not offered.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpumon.jobs.files import state_dir, write_atomic
from gpumon.model import GpuSample, Snapshot
from gpumon.units import format_bytes

HOOK_DIR = Path(__file__).resolve().parent / "torch_hook"
MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"


def mps_reachable(env: dict[str, str] | None = None) -> bool:
    pipe_dir = (env or os.environ).get("CUDA_MPS_PIPE_DIRECTORY", MPS_PIPE_DEFAULT)
    return Path(pipe_dir, "control").exists()


def limit_environment(limit: int | Sequence[int | None], card_totals: list[int],
                      base_env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """Variables to add for a job capped at `limit` bytes per card (one for all its cards, or each
    card's, None for a card without), and the mechanisms used."""
    limits = [limit] * len(card_totals) if isinstance(limit, int) else list(limit)
    shares = [lim / total for lim, total in zip(limits, card_totals) if lim and total > 0]
    env: dict[str, str] = {}
    applied = ["watchdog"]
    if shares:
        fraction = f"{min(1.0, *shares):.4f}"
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
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{i}={max(1, lim >> 20)}M" for i, lim in enumerate(limits) if lim)
        applied.append("mps")
    return env, applied


def limits_for(gpus: Sequence[GpuSample], asked: int | None, defaults: Mapping[str, int]) -> dict[str, int]:
    """The limit on each of the job's cards (by ref): the job's own on every card, else each card's
    default; cards without either are left out."""
    if asked:
        return {g.ref: asked for g in gpus}
    return {g.ref: defaults[g.ref] for g in gpus if defaults.get(g.ref)}


def by_index(gpus: Sequence[GpuSample], limits: Mapping[str, int]) -> dict[int, int]:
    """`limits_for`'s limits by card index, as the watchdog compares them (a MIG slice's processes
    are listed on its card: two slices of one card take the stricter)."""
    out: dict[int, int] = {}
    for g in gpus:
        if limit := limits.get(g.ref):
            out[g.index] = min(limit, out.get(g.index, limit))
    return out


def job_memory(snapshot: Snapshot, cards: set[int], pids: set[int]) -> dict[int, int]:
    """Per card, the GPU memory of the job's own processes (`pids`); other users' never count."""
    return {g.index: sum(p.gpu_memory or 0 for p in g.processes if p.pid in pids)
            for g in snapshot.gpus if g.index in cards}


UNREAD = ("error", "stale")  # card states whose memory is not known now (a lost card holds none)


def unwatched(snapshot: Snapshot, limits: Mapping[int, int]) -> str | None:
    """Why the job's memory on a card with a limit cannot be read now (the driver is gone, the card
    does not answer), or None: the watchdog would be blind there."""
    for g in snapshot.gpus:
        if g.index in limits and g.state in UNREAD:
            return f"GPU {g.index}: {g.error or g.state}"
    return None


def over_limit(used_per_card: dict[int, int], limit: int | Mapping[int, int]) -> str | None:
    """Why the job must stop, or None. The limit is per card (one for every card, or each card's by
    index): each card's memory of the job's processes is compared with its own limit (a process on
    two cards counts on each with that card's memory)."""
    for index, used in sorted(used_per_card.items()):
        cap = limit if isinstance(limit, int) else limit.get(index)
        if cap and used > cap:
            return f"memory limit exceeded on GPU {index}: {_binary(used)} > {_binary(cap)}"
    return None


def _binary(size: int) -> str:
    """'9.0 GiB', '512 MiB': the units spelled out in a record people read later."""
    short = format_bytes(size)
    return f"{short[:-1]} {short[-1]}iB" if short[-1] in "KMGT" else short


def card_limits() -> CardLimits:
    """This user's defaults, set with `m` (read by the TUI's dialogs and by every job's supervisor)."""
    return CardLimits(state_dir() / "card-limits.json")


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
