"""Who holds the cards, and who holds them idle: one row per user and one per Slurm job, Kubernetes
pod or container, on each host (the users view `u`, `gpumon users`, the `idle` alert rule, the page).

A process holds a card while a card lists it (with the memory it has there). Its holder's share of a
card's power is its share of the card's SM time, or of the card's memory while nobody computes; that
share integrated over the samples gpumon saw is its energy.

Idle: every process of the holder reports 0 % SM — per-process utilisation, which the NVIDIA driver
gives for processes busy since the last sample (a process missing from it is 0 %:
backends/nvml/values.py) — and has since gpumon last saw one of them compute, or since gpumon first
saw them. gpumon cannot know what happened before it watched, so `idle_s` is a lower bound of the
truth, never more. Where the driver does not report per-process SM (`sm_util` None) idleness is not
known: None, not 0.

A card that lists no processes but whose source names its holder (`GpuSample.owner`: a cluster read
through Prometheus, where dcgm-exporter labels a card with the pod or Slurm job holding it) counts
as held by that holder, as a whole card: kind "slurm" for "job ID", else "k8s" (id the
"namespace/pod" part); no user, no process (`processes` 0), not known since when (`held_s` None).
Its memory is the card's used memory, its SM % the card's utilisation (card-level, not per
process), its power the card's; it is idle while the card's utilisation is 0, by the same clock
(from when gpumon first saw it hold the card). A card shared by several pods (owners joined by
", ") counts for nobody: whose share is whose, nobody says, and counting the card for each would
count it twice. A card with processes is counted by its processes only.

The tracker is fed snapshots (of one host, or of a fleet host by host) and keeps per process (and
per card held without processes) only when it first saw it and when it last saw it busy: what a
sample pass adds is one pass over the processes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpumon.model import GpuSample, HostStatus, ProcessSample, Snapshot
from gpumon.sanitize import printable
from gpumon.units import format_bytes, format_duration

# Rows: users, and the jobs, pods and containers inside them. A systemd unit is only where a
# user's process runs (a login scope, a service), so its processes count for their user alone.
HOLDER_KINDS = ("user", "slurm", "k8s", "container")
LONGEST_GAP_S = 60.0  # a gap between two samples longer than this adds no energy: gpumon was not looking


@dataclass(frozen=True, slots=True)
class Holder:
    """A user, job, pod or container holding cards on a host (JSON: to_dict)."""

    host: str
    kind: str  # one of HOLDER_KINDS
    id: str  # user name, job id (JOBID, an array task ARRAYJOB_TASK), pod UID, short container id; a step: JOBID.STEP
    label: str  # as tables show it: "alice", "job 4242", "ml/trainer-7f9c (main)", "docker:llama"; "step 0"
    user: str | None
    cards: tuple[int, ...]  # indices of the cards it holds
    uuids: tuple[str | None, ...]
    processes: int
    gpu_memory: int | None  # bytes, summed over its processes (None: the driver did not say for any)
    sm_util: int | None  # per-process SM %, summed (None: not reported)
    power_w: float | None  # its share of its cards' power draw
    held_s: float | None  # since its oldest process on the cards started
    idle_s: float | None  # seconds every process has shown 0 % SM (None: computing, or not known)
    energy_j: float | None  # its share of its cards' energy while gpumon watched
    watched_s: float  # how long gpumon has seen it: idle_s never exceeds this
    # Its part of each card, index -> [uuid, memory, SM % (None: not reported), power]: what the usage
    # ledger keeps per card (read it through shares()). Kept as the sums were made: building
    # objects for it each sample would cost the users view and the idle rule, which never read it.
    # Not in to_dict: the users document has the totals.
    parts: dict[int, list] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def shares(self) -> list[CardShare]:
        """Its part of each card, in index order."""
        return [CardShare(i, *self.parts[i]) for i in self.cards]

    steps: tuple[Holder, ...] = ()  # a Slurm job's steps that hold cards (kind "step"), by step id

    @property
    def idle(self) -> bool:
        return self.idle_s is not None

    def idle_text(self) -> str:
        """'idle 2h12m holding 40G on 2 cards'; '' while it computes or nobody knows."""
        if self.idle_s is None:
            return ""
        cards = f"{len(self.cards)} card" + ("s" if len(self.cards) != 1 else "")
        return f"idle {format_duration(self.idle_s)} holding {format_bytes(self.gpu_memory, na='?')} on {cards}"

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "kind": self.kind, "id": self.id, "label": self.label, "user": self.user,
                "cards": list(self.cards), "uuids": list(self.uuids), "processes": self.processes,
                "gpu_memory": self.gpu_memory, "sm_util": self.sm_util,
                "power_w": None if self.power_w is None else round(self.power_w, 1),
                "held_s": None if self.held_s is None else round(self.held_s, 1),
                "idle_s": None if self.idle_s is None else round(self.idle_s, 1),
                "energy_j": None if self.energy_j is None else round(self.energy_j, 1),
                "watched_s": round(self.watched_s, 1),
                **({"steps": [s.to_dict() for s in self.steps]} if self.kind == "slurm" else {})}


@dataclass(frozen=True, slots=True)
class CardShare:
    """A holder's part of one card in one snapshot: memory, SM % and power of its processes there."""

    index: int
    uuid: str | None
    gpu_memory: int | None
    sm_util: int | None  # None: no process of it there reports per-process SM
    power_w: float | None


def holder_keys(p: ProcessSample) -> list[tuple[str, str, str, str | None]]:
    """(kind, id, label, user) of each row a process counts in: its user's, and its job's, pod's or
    container's; a Slurm job's process also its step's (kind "step", kept inside the job's row:
    the README's rows are per job, so one job is one holder and one idle alert, whatever its steps)."""
    owner = p.owner
    user = p.user or (owner.user if owner is not None else None)
    keys = [("user", user or "?", user or "?", user)]
    if owner is not None and owner.kind == "slurm":
        job, _, step = owner.id.partition(".")
        keys.append(("slurm", job, f"job {job}", user))
        if step:
            keys.append(("step", owner.id, f"step {step}", user))
    elif owner is not None and owner.kind in HOLDER_KINDS and owner.kind != "user":
        keys.append((owner.kind, owner.id, owner.label, user))
    return keys


def card_holder(gpu: GpuSample) -> str | None:
    """Who holds the card, when one job, pod or container holds all of it: the source's name for it
    (dcgm-exporter's pod), else the one owner of all its processes."""
    if gpu.owner:
        return gpu.owner
    found = None
    for p in gpu.processes:
        keys = holder_keys(p)
        if len(keys) < 2:
            return None
        if found is None:
            found = keys[1]
        elif keys[1][:2] != found[:2]:
            return None
    return found[2] if found is not None else None


class _Sum:
    """One holder's figures in the snapshot being read."""

    __slots__ = ("label", "user", "cards", "processes", "memory", "sm", "sm_known", "power", "started",
                 "idle_since", "busy", "unknown", "first_seen")

    def __init__(self, label: str, user: str | None) -> None:
        self.label, self.user = label, user
        self.cards: dict[int, list] = {}  # index -> [uuid, memory, SM % (None: unknown), power] there
        self.processes = 0
        self.memory: int | None = None
        self.sm = 0
        self.sm_known = False
        self.power: float | None = None
        self.started: float | None = None
        self.idle_since: float | None = None  # the latest time one of its processes was busy (or first seen)
        self.busy = self.unknown = False
        self.first_seen: float | None = None


class HolderTracker:
    """Feed it every snapshot as it comes; it answers the holders of that moment."""

    def __init__(self) -> None:
        # Per host, so one host's update costs its own processes, never the fleet's (linear in
        # hosts x processes per interval): each update replaces its host's entries with those seen.
        # host -> (pid, start time) -> [first seen, last seen busy or None]
        self._processes: dict[str, dict[tuple[int, float | None], list[float | None]]] = {}
        # host -> (card's UUID or index, its holder) -> the same, for cards held without processes
        self._cards: dict[str, dict[tuple[str | int, str], list[float | None]]] = {}
        self._energy: dict[str, dict[tuple[str, str], float]] = {}  # host -> (kind, id) -> joules
        self._last_time: dict[str, float] = {}
        self._last: dict[str, tuple[float, tuple[Holder, ...]]] = {}

    def update(self, snapshot: Snapshot, host: str | None = None) -> tuple[Holder, ...]:
        """The holders on `snapshot`'s host (`host`: the name to give it, a fleet's entry)."""
        host = host or snapshot.host
        cached = self._last.get(host)
        if cached is not None and cached[0] == snapshot.time:  # a fleet re-sends a host's last snapshot
            return cached[1]
        now = snapshot.time
        previous = self._last_time.get(host)
        gap = now - previous if previous is not None and 0 < now - previous <= LONGEST_GAP_S else 0.0
        sums: dict[tuple[str, str], _Sum] = {}
        known = self._processes.get(host, {})
        seen: dict[tuple[int, float | None], list[float | None]] = {}
        known_cards = self._cards.get(host, {})
        cards: dict[tuple[str | int, str], list[float | None]] = {}
        for gpu in snapshot.gpus:
            if not gpu.processes:
                if gpu.owner and ", " not in gpu.owner and gpu.state != "lost":
                    self._add_card(sums, known_cards, cards, gpu, now)
                continue
            shares = _power_shares(gpu.processes, gpu.power_draw)
            for p, power in zip(gpu.processes, shares):
                key = (p.pid, p.started)
                times = seen.get(key) or known.get(key)
                if times is None:
                    times = [now, None]
                seen[key] = times
                if p.sm_util:
                    times[1] = now
                for kind, ident, label, user in holder_keys(p):
                    total = sums.get((kind, ident))
                    if total is None:
                        total = sums[kind, ident] = _Sum(label, user)
                    total.processes += 1
                    if p.started is not None and (total.started is None or p.started < total.started):
                        total.started = p.started
                    _add(total, gpu.index, gpu.uuid, p.gpu_memory, p.sm_util, power, times)
        self._processes[host] = seen  # processes not seen are gone
        self._cards[host] = cards
        holders = []
        spent = self._energy.get(host, {})
        energies: dict[tuple[str, str], float] = {}  # a holder gone is dropped: back, it starts again
        steps: dict[str, list[Holder]] = {}
        for (kind, ident), total in sums.items():
            energy = energies[kind, ident] = spent.get((kind, ident), 0.0) + (total.power or 0.0) * gap
            holder = _holder(host, kind, ident, total, now, energy if total.power is not None else None)
            if kind == "step":
                steps.setdefault(ident.partition(".")[0], []).append(holder)
            else:
                holders.append(holder)
        self._energy[host] = energies
        if steps:
            holders = [dataclasses.replace(h, steps=tuple(sorted(steps[h.id], key=_step_order)))
                       if h.kind == "slurm" and h.id in steps else h for h in holders]
        result = tuple(sorted(holders, key=_order))
        self._last_time[host] = now
        self._last[host] = (now, result)
        return result

    @staticmethod
    def _add_card(sums: dict[tuple[str, str], _Sum], known: dict[tuple[str | int, str], list[float | None]],
                  cards: dict[tuple[str | int, str], list[float | None]], gpu: GpuSample, now: float) -> None:
        """A card held as a whole by the holder its source names (no processes listed)."""
        owner = gpu.owner or ""
        kind, ident = ("slurm", owner[4:].partition(".")[0]) if owner.startswith("job ") \
            else ("k8s", owner.partition(" (")[0])
        key = (gpu.uuid or gpu.index, owner)
        times = cards.get(key) or known.get(key)
        if times is None:
            times = [now, None]
        cards[key] = times
        if gpu.utilization_gpu:
            times[1] = now
        total = sums.get((kind, ident))
        if total is None:
            total = sums[kind, ident] = _Sum(owner, None)
        _add(total, gpu.index, gpu.uuid, gpu.memory_used, gpu.utilization_gpu, gpu.power_draw, times)


def _power_shares(processes: tuple[ProcessSample, ...], power: float | None) -> list[float | None]:
    """Each process's share of the card's power: by SM time while any computes, else by memory."""
    if power is None:
        return [None] * len(processes)
    weights = [p.sm_util or 0 for p in processes]
    if not any(weights):
        weights = [p.gpu_memory or 0 for p in processes]
    total = sum(weights)
    if not total:
        return [power / len(processes)] * len(processes)
    return [power * w / total for w in weights]


def _add(total: _Sum, index: int, uuid: str | None, memory: int | None, sm: int | None, power: float | None,
         times: list[float | None]) -> None:
    """One process's (or one card's held without processes) figures on card `index`."""
    part = total.cards.get(index)
    if part is None:
        total.cards[index] = [uuid, memory, sm, power]
    else:
        if memory is not None:
            part[1] = (part[1] or 0) + memory
        if sm is not None:
            part[2] = (part[2] or 0) + sm
        if power is not None:
            part[3] = (part[3] or 0.0) + power
    if memory is not None:
        total.memory = (total.memory or 0) + memory
    if sm is None:
        total.unknown = True
    else:
        total.sm_known = True
        total.sm += sm
        total.busy = total.busy or sm > 0
    if power is not None:
        total.power = (total.power or 0.0) + power
    first_seen, last_busy = times
    since = last_busy if last_busy is not None else first_seen
    if total.idle_since is None or (since is not None and since > total.idle_since):
        total.idle_since = since
    if total.first_seen is None or (first_seen is not None and first_seen < total.first_seen):
        total.first_seen = first_seen


def _holder(host: str, kind: str, ident: str, total: _Sum, now: float, energy: float | None) -> Holder:
    idle = None
    if not total.busy and not total.unknown and total.idle_since is not None:
        idle = max(0.0, now - total.idle_since)
    indices = tuple(sorted(total.cards))
    return Holder(host=host, kind=kind, id=ident, label=total.label, user=total.user, cards=indices,
                  uuids=tuple(total.cards[i][0] for i in indices), processes=total.processes,
                  gpu_memory=total.memory, sm_util=total.sm if total.sm_known else None, power_w=total.power,
                  held_s=max(0.0, now - total.started) if total.started is not None else None,
                  idle_s=idle, energy_j=energy,
                  watched_s=max(0.0, now - total.first_seen) if total.first_seen is not None else 0.0,
                  parts=total.cards)


def _step_order(h: Holder) -> tuple:
    """Numbered steps by number, then batch, extern, interactive."""
    step = h.id.partition(".")[2]
    return (not step.isdigit(), int(step) if step.isdigit() else 0, step)


def _order(h: Holder) -> tuple:
    """Users by name, each followed by its jobs, pods and containers."""
    return (h.user or "?", h.kind != "user", h.kind, h.id)


# -- what the views say of them (the users view `u`, `gpumon users`, the page) --


def users_document(holders: Iterable[Holder], now: float, window_s: float,
                   statuses: Iterable[HostStatus] | None = None) -> dict[str, Any]:
    """`gpumon users --json` (and the page's /api/users): `window_s` is how long the holders were
    watched; `statuses`: a fleet's hosts, listed as `snapshot --hosts --json` lists them, without their cards."""
    doc: dict[str, Any] = {"schema": 1, "time": now, "window_s": round(window_s, 3),
                           "holders": [h.to_dict() for h in holders]}
    if statuses is not None:
        doc["hosts"] = [{k: v for k, v in dataclasses.replace(s, snapshot=None).to_dict().items() if k != "snapshot"}
                        for s in statuses]
    return doc


def idle_cell(h: Holder) -> str:
    """'2h12m' while idle; blank while it computes; '?' where per-process SM is not reported."""
    if h.idle_s is not None:
        return format_duration(h.idle_s)
    return "?" if not h.sm_util else ""  # nothing computes, yet not idle: some process's SM is unknown


def idle_holders(holders: tuple[Holder, ...]) -> list[Holder]:
    """The holders to name as idle: idle users, and idle jobs/pods/containers of users who compute
    elsewhere (an idle user's jobs are idle too: naming the user says it)."""
    idle_users = {(h.host, h.user) for h in holders if h.kind == "user" and h.idle}
    return [h for h in holders if h.idle and (h.kind == "user" or (h.host, h.user) not in idle_users)]


def summary(holders: tuple[Holder, ...], hosts: bool = False) -> tuple[str, str]:
    """(the idle part, the rest) of the line above the table: "2 holders idle: alice idle 2h12m
    holding 40G on 2 cards; job 77.0 (bob) idle 3m holding 20G on 2 cards", and how many hold cards.
    Names are made printable."""
    users = sum(1 for h in holders if h.kind == "user")
    others = len(holders) - users
    counts = f"{users} user{'s' if users != 1 else ''}"
    if others:
        counts += f", {others} job{'s' if others != 1 else ''}/pod{'s' if others != 1 else ''}/container" \
                  + ("s" if others != 1 else "")
    idle = idle_holders(holders)
    if not holders:
        return "", "nobody holds a card"
    if not idle:
        return "", f"nobody holds a card idle · {counts} hold cards"
    named = []
    for h in idle:
        who = printable(h.label) + ("" if h.kind == "user" or h.user is None else f" ({printable(h.user)})")
        named.append((f"{printable(h.host)}: " if hosts else "") + f"{who} {h.idle_text()}")
    head = f"{len(idle)} holder{'s' if len(idle) != 1 else ''} idle: "
    return head + "; ".join(named), f" · {counts}"
