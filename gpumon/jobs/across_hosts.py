"""Placement across hosts: the best free set of cards on ONE host (a job never spans hosts).

Each host's candidate set is chosen exactly as on one machine (`placement.choose`: free enough,
best links, least loaded); the hosts' sets are then ranked by the same measures: weakest link
first, then the most free memory, then the lowest utilisation, then the order hosts were listed.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from gpumon.cards.topology import UNKNOWN_RANK, link_between, link_rank
from gpumon.jobs.claims_and_queue import CardsTaken
from gpumon.jobs.placement import Choice, choose
from gpumon.model import HostStatus, Topology
from gpumon.units import format_bytes


@dataclass(frozen=True)
class HostChoice:
    host: str
    choice: Choice


def _links(choice: Choice, topo: Topology | None) -> tuple[float, float]:
    pairs = list(itertools.combinations([g.index for g in choice.gpus], 2))
    if not pairs:
        return (0.0, 0.0)
    ranks = [link_rank(link_between(topo, a, b)) if topo is not None else UNKNOWN_RANK for a, b in pairs]
    return (max(ranks), sum(ranks) / len(ranks))


def _rank(position: int, choice: Choice, topo: Topology | None) -> tuple:
    free = sum(g.memory_free or 0 for g in choice.gpus)
    util = sum(g.utilization_gpu or 0 for g in choice.gpus)
    return (_links(choice, topo), -free, util, position)


def wants_topology(hosts: list[HostStatus], count: int, min_free: str | None = None,
                   max_util: float | None = None, max_used: str | None = None) -> list[str]:
    """The hosts `choose_across` will ask `topology` of: those that have `count` (>1) free cards.
    A caller that reaches hosts over the network asks them all at once, then answers from that."""
    if count < 2:
        return []
    out = []
    for status in hosts:
        if status.snapshot is None or status.state not in ("live", "stale"):
            continue
        try:
            choose(status.snapshot, count, None, min_free, max_util, max_used)
        except ValueError:
            continue
        out.append(status.host)
    return out


def choose_across(hosts: list[HostStatus], count: int, topology: Callable[[str], Topology | None],
                  min_free: str | None = None, max_util: float | None = None,
                  max_used: str | None = None, here: CardsTaken | None = None) -> tuple[HostChoice | None, list[str]]:
    """The best host's set, and for people a line per host: what it could offer, or why nothing.
    `topology(host)` is asked only for hosts that have `count` (>1) free cards. The bars are
    `select`'s, the same as on one machine; cards others claim or reserve are left out as there,
    as each host said with its snapshot (`here`: this machine's, for the host `local`)."""
    best: tuple[tuple, HostChoice] | None = None
    reasons: list[str] = []
    for position, status in enumerate(hosts):
        if status.snapshot is None or status.state not in ("live", "stale"):
            reasons.append(f"{status.host}: {status.state}" + (f" ({status.error})" if status.error else ""))
            continue
        taken, mine = taken_on(status, here)
        try:
            choice = choose(status.snapshot, count, None, min_free, max_util, max_used, taken, mine)
            topo = topology(status.host) if count > 1 else None
            if topo is not None:
                choice = choose(status.snapshot, count, topo, min_free, max_util, max_used, taken, mine)
        except ValueError as exc:
            reasons.append(f"{status.host}: {exc}")
            reasons += [f"{status.host}: {why}" for why in getattr(exc, "reasons", ())]  # each card's (TooFewFree)
            continue
        key = _rank(position, choice, topo)
        if best is None or key < best[0]:
            best = (key, HostChoice(status.host, choice))
        reasons.append(f"{status.host}: could offer " + ", ".join(f"GPU {g.index}" for g in choice.gpus)
                       + f" ({format_bytes(-key[1])} free)")
    return (best[1] if best else None), reasons


def taken_on(status: HostStatus, here: CardsTaken | None) -> tuple[dict[str, str], frozenset[str]]:
    """The cards others hold on that host (ref -> why) and the user's reserved ones there."""
    if status.source == "local":
        return (dict(here.skip), here.mine) if here is not None else ({}, frozenset())
    return dict(status.taken), status.mine
