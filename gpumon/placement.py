"""Choosing cards: which are free enough, and which set of them is best connected.

Link quality, best first: NVLink (more links better) > PIX (one PCIe switch) > PXB (several
switches) > PHB (same host bridge) > NODE (same NUMA node) > SYS (across sockets).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from gpumon.model import GpuSample, Snapshot, Topology
from gpumon.units import format_bytes, parse_size

LINK_RANK = {"PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5}
UNKNOWN_RANK = 6
LINK_WORDS = {"PIX": "one PCIe switch", "PXB": "several PCIe switches", "PHB": "same PCIe host bridge",
              "NODE": "same NUMA node", "SYS": "across CPU sockets"}
MAX_COMBINATIONS = 20000  # beyond this many candidate sets, grow the set greedily instead


def link_rank(link: str | None) -> float:
    """Lower is better. NVLink ranks below every PCIe path, more links ranking lower."""
    if link and link.startswith("NV"):
        try:
            return 1 - int(link[2:]) / 100  # NV12 -> 0.88, NV4 -> 0.96
        except ValueError:
            return 0.99
    return LINK_RANK.get(link or "", UNKNOWN_RANK)


def describe_link(link: str | None) -> str:
    if link and link.startswith("NV"):
        return f"{link[2:]} NVLinks"
    return LINK_WORDS.get(link or "", "unknown link")


def best_partners(topo: Topology, index: int) -> list[tuple[int, str | None]]:
    """The other cards, best connected to `index` first."""
    if index not in topo.indices:
        return []
    row = topo.links[topo.indices.index(index)]
    others = [(other, row[j]) for j, other in enumerate(topo.indices) if other != index]
    return sorted(others, key=lambda pair: (link_rank(pair[1]), pair[0]))


def load_key(gpu: GpuSample) -> tuple[float, float, int]:
    """Least loaded first: most free memory, then lowest utilisation, then NVML order."""
    return (-(gpu.memory_free or 0), gpu.utilization_gpu or 0, gpu.index)


def free_enough(gpu: GpuSample, min_free: str | None, max_util: float | None) -> str | None:
    """None when the card qualifies, else why not. `min_free` is a SIZE as the user wrote it
    ('8G', '50%' of this card's total)."""
    if gpu.state != "ok":
        return f"card is {gpu.state}"
    if min_free is not None:
        needed = parse_size(min_free, gpu.memory_total)
        if gpu.memory_free is None or gpu.memory_free < needed:
            return f"{format_bytes(gpu.memory_free)} free < {format_bytes(needed)}"
    if max_util is not None and (gpu.utilization_gpu is None or gpu.utilization_gpu > max_util):
        return "too busy"
    return None


@dataclass(frozen=True)
class Choice:
    gpus: tuple[GpuSample, ...]
    reasons: tuple[str, ...]


def _set_cost(indices: tuple[int, ...], topo: Topology | None) -> tuple[float, float]:
    if topo is None or len(indices) < 2:
        return (0.0, 0.0)
    pos = {idx: i for i, idx in enumerate(topo.indices)}
    ranks = [link_rank(topo.links[pos[a]][pos[b]]) if a in pos and b in pos else UNKNOWN_RANK
             for a, b in itertools.combinations(indices, 2)]
    return (max(ranks), sum(ranks) / len(ranks))


def choose(snapshot: Snapshot, count: int, topo: Topology | None = None, min_free: str | None = None,
           max_util: float | None = None) -> Choice:
    """The `count` free-enough cards with the best links among them (then the least loaded).

    Raises ValueError when fewer than `count` cards qualify.
    """
    reasons: list[str] = []
    eligible = []
    for gpu in snapshot.gpus:
        why_not = free_enough(gpu, min_free, max_util)
        if why_not:
            reasons.append(f"GPU {gpu.index} skipped: {why_not}")
        else:
            eligible.append(gpu)
    if len(eligible) < count:
        raise ValueError(f"only {len(eligible)} of {len(snapshot.gpus)} cards are free enough for {count}")
    eligible.sort(key=load_key)
    by_index = {g.index: g for g in eligible}
    if count == 1 or topo is None:
        chosen = tuple(eligible[:count])
        reasons.append("least loaded: " + ", ".join(f"GPU {g.index}" for g in chosen))
        return Choice(chosen, tuple(reasons))
    indices = [g.index for g in eligible]
    load_rank = {idx: i for i, idx in enumerate(indices)}
    if math.comb(len(indices), count) <= MAX_COMBINATIONS:
        candidates = itertools.combinations(indices, count)
    else:  # grow a set from each card, adding its best-connected partner each time
        candidates = (_greedy(start, indices, count, topo) for start in indices)
    best = min(candidates, key=lambda s: (_set_cost(s, topo), sum(load_rank[i] for i in s)))
    chosen = tuple(sorted((by_index[i] for i in best), key=lambda g: g.index))
    worst = max(((a, b) for a, b in itertools.combinations(best, 2)),
                key=lambda pair: link_rank(_link(topo, *pair)))
    reasons.append(
        "chose " + ", ".join(f"GPU {g.index}" for g in chosen)
        + f": weakest link {describe_link(_link(topo, *worst))} (GPU {worst[0]}–{worst[1]})")
    return Choice(chosen, tuple(reasons))


def _link(topo: Topology, a: int, b: int) -> str | None:
    return topo.links[topo.indices.index(a)][topo.indices.index(b)] if a in topo.indices and b in topo.indices else None


def _greedy(start: int, indices: list[int], count: int, topo: Topology) -> tuple[int, ...]:
    chosen = [start]
    while len(chosen) < count:
        rest = [i for i in indices if i not in chosen]
        chosen.append(min(rest, key=lambda i: max(link_rank(_link(topo, i, c)) for c in chosen)))
    return tuple(chosen)

