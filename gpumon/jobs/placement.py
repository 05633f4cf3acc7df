"""Choosing cards for a job and pinning it to them, so it lands on exactly those cards.

- `resolve_spec` turns a GPU SPEC (index, UUID, MIG UUID, PCI bus id, list, auto[:N]) into cards.
- `choose` picks the N free-enough cards with the best links among them (then the least loaded);
  `gpumon select`, `--gpu auto:N`, queued jobs and failover all use it. A card whose health
  verdict is "fail" is never free, nor one in `taken` (claimed by a job, reserved by someone
  else: gpumon/sharing); cards in `preferred` (the user's own reservations) come first.
- `pin` (jobs/pinning.py) is the environment every launch path gives a job, per vendor.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from gpumon.cards.cuda_order import granted
from gpumon.cards.topology import UNKNOWN_RANK, describe_link, link_between, link_rank
from gpumon.errors import UsageError
from gpumon.jobs.pinning import Pinning, local_cpus, one_vendor, pin  # noqa: F401 - where launches find them
from gpumon.model import GpuSample, Snapshot, Topology
from gpumon.sanitize import printable
from gpumon.units import format_bytes, parse_size
from gpumon.vendors import DEFAULT_VENDOR, vendor

MAX_COMBINATIONS = 20000  # beyond this many candidate sets, grow the set greedily instead
# A card someone else is using is not free, unless the user lowers the bar (--max-util, --max-used):
# more than this utilisation, or more than this share of its memory in use.
BUSY_UTIL = 10.0
BUSY_USED = "10%"


# A card chosen by hand (`run --gpu 0`, the TUI's `r`) is still used, but the user is told when
# it is this busy: at least half its compute, or half its memory, already taken by others. (Lower
# than this is normal sharing on a workstation; the bar for *choosing* a card, above, is lower.)
WARN_UTIL = 50.0
WARN_USED_SHARE = 0.5
WARN_HOLDERS = 3  # users named in the note; the rest are counted


def busy_note(gpu: GpuSample, where: str | None = None) -> str | None:
    """'GPU 0 is busy: 97% utilised, 69G of 80G in use, by alice (pid 4242)', or None when the card
    is not busy (WARN_UTIL, WARN_USED_SHARE) or says nothing of its load; a compute mode that
    leaves no room comes first."""
    if gpu.state != "ok":
        return None
    if why := exclusive_note(gpu):
        return f"{where or f'GPU {gpu.index}'} is in {why}"
    util = gpu.utilization_gpu
    used, total = gpu.memory_used, gpu.memory_total
    busy_compute = util is not None and util >= WARN_UTIL
    busy_memory = used is not None and bool(total) and used >= WARN_USED_SHARE * total
    if not (busy_compute or busy_memory):
        return None
    load = [f"{util}% utilised"] if util is not None else []
    if used is not None and total:
        load.append(f"{format_bytes(used)} of {format_bytes(total)} in use")
    pids: dict[str, list[int]] = {}  # user -> pids, the biggest users of memory first
    for proc in sorted(gpu.processes, key=lambda p: -(p.gpu_memory or 0)):
        pids.setdefault(printable(proc.user or "?"), []).append(proc.pid)
    holders = [f"{user} (pid{'s' if len(ps) > 1 else ''} {', '.join(map(str, ps))})"
               for user, ps in list(pids.items())[:WARN_HOLDERS]]
    if len(pids) > WARN_HOLDERS:
        holders.append(f"{len(pids) - WARN_HOLDERS} more users")
    by = f", by {', '.join(holders)}" if holders else ""
    return f"{where or f'GPU {gpu.index}'} is busy: {', '.join(load)}{by}"


def load_key(gpu: GpuSample) -> tuple[float, float, int]:
    """Least loaded first: most free memory, then lowest utilisation, then NVML order."""
    return (-(gpu.memory_free or 0), gpu.utilization_gpu or 0, gpu.index)


def _sizes(have: int | None, bar: int) -> tuple[str, str]:
    """Two sizes in words, with enough digits that they never read the same ("70G < 70G")."""
    a, b = format_bytes(have), format_bytes(bar)
    if a == b and have is not None:
        a, b = f"{have / (1 << 30):.2f}G", f"{bar / (1 << 30):.2f}G"
    return a, b


def free_enough(gpu: GpuSample, min_free: str | None = None, max_util: float | None = None,
                max_used: str | None = None) -> str | None:
    """None when the card is free enough, else why not, in words. `min_free` and `max_used` are
    SIZEs as the user wrote them ('8G', '50%' of this card's total); `max_util` and `max_used`
    default to BUSY_UTIL and BUSY_USED."""
    if gpu.state == "stale":
        return f"not responding (no answer for {gpu.stale_s or 0:.0f} s)"
    if gpu.state != "ok":
        if not gpu.error:
            return f"card is {gpu.state}"
        return gpu.error if gpu.state in gpu.error.lower() else f"{gpu.state}: {gpu.error}"
    if gpu.health is not None and gpu.health.verdict == "fail":  # never chosen, however free it looks
        return "failing its health check: " + "; ".join(r.text for r in gpu.health.reasons)
    if gpu.mig_mode:
        return "in MIG mode: programs see its slices, never the whole card"
    if why := exclusive_note(gpu):
        return why
    util_bar = BUSY_UTIL if max_util is None else max_util
    if gpu.utilization_gpu is not None and gpu.utilization_gpu > util_bar:
        return f"busy: {gpu.utilization_gpu}% utilised (more than {util_bar:g}%; --max-util raises the bar)"
    used_text = max_used or BUSY_USED
    relative = used_text.endswith("%")
    if gpu.memory_used is not None and (gpu.memory_total or not relative):
        used_bar = parse_size(used_text, gpu.memory_total)
        if gpu.memory_used > used_bar:
            used, bar = _sizes(gpu.memory_used, used_bar)
            bar_words = f"{used_text} = {bar}" if relative else bar
            return (f"busy: {used} of {format_bytes(gpu.memory_total)} in use (more than {bar_words}; "
                    "--max-used raises the bar)")
    if min_free is not None:
        needed = parse_size(min_free, gpu.memory_total)
        if gpu.memory_free is None or gpu.memory_free < needed:
            have, want = _sizes(gpu.memory_free, needed)
            return f"too full: {have} free, {want} needed (--min-free)"
    return None


def exclusive_note(gpu: GpuSample) -> str | None:
    """Why the card's compute mode leaves no room for a job, or None: 'prohibited' takes no CUDA
    context; an exclusive one that already runs a process takes no second (it fails at its first
    CUDA call)."""
    mode = gpu.compute_mode
    if mode == "prohibited":
        return "compute mode PROHIBITED: no CUDA program may run on it (nvidia-smi -c 0 allows them)"
    if mode in ("exclusive_process", "exclusive_thread") and any(p.type != "graphics" for p in gpu.processes):
        return (f"compute mode {mode.upper()} and already running a process: a second fails at its first "
                "CUDA call")
    return None


def mig_slices(gpu: GpuSample) -> list[GpuSample]:
    """A card's MIG slices, each standing in for the card under its own UUID and memory."""
    return [dataclasses.replace(gpu, uuid=m.uuid, name=m.name, memory_total=m.memory_total, memory_used=m.memory_used,
                                memory_free=None if m.memory_total is None or m.memory_used is None
                                else m.memory_total - m.memory_used,
                                utilization_gpu=None, mig_mode=False, mig_devices=())
            for m in gpu.mig_devices]


@dataclass(frozen=True)
class Choice:
    gpus: tuple[GpuSample, ...]
    reasons: tuple[str, ...]


class TooFewFree(ValueError):
    """Fewer cards are free than asked for; `reasons` says why each other card is not."""

    def __init__(self, message: str, reasons: list[str]) -> None:
        super().__init__(message)
        self.reasons = tuple(reasons)


def _set_cost(indices: tuple[int, ...], topo: Topology | None) -> tuple[float, float]:
    if topo is None or len(indices) < 2:
        return (0.0, 0.0)
    pos = {idx: i for i, idx in enumerate(topo.indices)}
    ranks = [link_rank(topo.links[pos[a]][pos[b]]) if a in pos and b in pos else UNKNOWN_RANK
             for a, b in itertools.combinations(indices, 2)]
    return (max(ranks), sum(ranks) / len(ranks))


def _candidates(snapshot: Snapshot, count: int, min_free: str | None, max_util: float | None,
                max_used: str | None, reasons: list[str], taken: Mapping[str, str]) -> list[GpuSample]:
    """Free whole cards and, for a single card, free MIG slices; why each other card is not."""
    eligible = []
    # A program is built for one vendor's runtime: a set is one vendor's cards, the host's first
    # (NVIDIA's on a host that has both); other vendors' cards are used when named (--gpu 4).
    first = snapshot.gpus[0].vendor if snapshot.gpus else DEFAULT_VENDOR
    for gpu in snapshot.gpus:
        if gpu.vendor != first:
            reasons.append(f"GPU {gpu.index} skipped: {vendor(gpu.vendor).a_card}; auto "
                           f"chooses among the {vendor(first).words} cards (--gpu {gpu.index} uses it)")
            continue
        if gpu.ref in taken:
            reasons.append(f"GPU {gpu.index} skipped: {taken[gpu.ref]}")
            continue
        if gpu.state == "ok" and gpu.mig_mode:
            if count > 1:
                reasons.append(f"GPU {gpu.index} skipped: in MIG mode, and a program sees one MIG slice at most")
                continue
            free = [s for s in mig_slices(gpu)
                    if s.uuid not in taken and free_enough(s, min_free, max_util, max_used) is None]
            reasons.append(f"GPU {gpu.index} is in MIG mode: {len(free)} of {len(gpu.mig_devices)} slices free")
            eligible += free
            continue
        why_not = free_enough(gpu, min_free, max_util, max_used)
        if why_not:
            reasons.append(f"GPU {gpu.index} skipped: {why_not}")
        else:
            eligible.append(gpu)
    return eligible


def choose(snapshot: Snapshot, count: int, topo: Topology | None = None, min_free: str | None = None,
           max_util: float | None = None, max_used: str | None = None, taken: Mapping[str, str] | None = None,
           preferred: Collection[str] = ()) -> Choice:
    """The `count` free cards with the best links among them (then the least loaded). Busy cards
    are never free unless the bar is lowered; a card in MIG mode offers its free slices instead
    (to a single-card request).

    Raises TooFewFree (a ValueError) when fewer than `count` cards qualify.
    """
    reasons: list[str] = []
    eligible = _candidates(snapshot, count, min_free, max_util, max_used, reasons, taken or {})
    if len(eligible) < count:
        raise TooFewFree(f"only {len(eligible)} of {len(snapshot.gpus)} cards are free, {count} wanted "
                         "(--verbose says why; --max-util, --max-used and --min-free set the bar)", reasons)
    eligible.sort(key=load_key)
    own = [g for g in eligible if g.ref in preferred]
    if len(own) >= count:  # the user's own reserved cards, when they are enough
        eligible = own
    if count == 1 or topo is None:
        chosen = tuple(eligible[:count])
        reasons.append("chose " + ", ".join(_name(g) for g in chosen) + ": the least loaded of the free cards ("
                       + "; ".join(f"{format_bytes(g.memory_free)} free" for g in chosen) + ")")
        return Choice(chosen, tuple(reasons))
    by_index = {g.index: g for g in eligible}
    indices = [g.index for g in eligible]
    load_rank = {idx: i for i, idx in enumerate(indices)}
    if math.comb(len(indices), count) <= MAX_COMBINATIONS:
        candidates = itertools.combinations(indices, count)
    else:  # grow a set from each card, adding its best-connected partner each time
        candidates = (_greedy(start, indices, count, topo) for start in indices)
    best = min(candidates, key=lambda s: (_set_cost(s, topo), sum(load_rank[i] for i in s)))
    chosen = tuple(sorted((by_index[i] for i in best), key=lambda g: g.index))
    worst = max(((a, b) for a, b in itertools.combinations(best, 2)),
                key=lambda pair: link_rank(link_between(topo, *pair)))
    reasons.append(
        "chose " + ", ".join(_name(g) for g in chosen)
        + f": the best-linked set of {count} free cards (weakest link: {describe_link(link_between(topo, *worst))},"
        + f" GPU {worst[0]}–{worst[1]}), then the least loaded")
    return Choice(chosen, tuple(reasons))


def _name(gpu: GpuSample) -> str:
    return f"GPU {gpu.index}" + (f" slice {gpu.uuid}" if gpu.uuid and gpu.uuid.startswith("MIG-") else "")


def _greedy(start: int, indices: list[int], count: int, topo: Topology) -> tuple[int, ...]:
    chosen = [start]
    while len(chosen) < count:
        rest = [i for i in indices if i not in chosen]
        chosen.append(min(rest, key=lambda i: max(link_rank(link_between(topo, i, c)) for c in chosen)))
    return tuple(chosen)


def _norm_bus(bus: str) -> str:
    """'0000:17:00.0', '00000000:17:00.0' and '17:00.0' name the same device."""
    bus = bus.lower()
    parts = bus.split(":")
    if len(parts) == 3:
        parts[0] = parts[0].lstrip("0")
    elif len(parts) == 2:
        parts.insert(0, "")
    return ":".join(parts)


def auto_count(spec: str) -> int | None:
    """How many cards `auto[:N]` asks for; None for a SPEC that names cards."""
    if not (spec == "auto" or spec.startswith("auto:")):
        return None
    count_text = spec.partition(":")[2] or "1"
    if not (count_text.isascii() and count_text.isdigit()) or int(count_text) < 1:
        raise UsageError(f"bad --gpu {spec!r}: auto:N needs a whole number N of at least 1")
    return int(count_text)


def resolve_spec(spec: str, snapshot: Snapshot, topo: Topology | None = None,
                 min_free: str | None = None, max_util: float | None = None,
                 max_used: str | None = None, taken: Mapping[str, str] | None = None,
                 preferred: Collection[str] = ()) -> list[GpuSample]:
    """GPU SPEC -> cards: NVML index, UUID (GPU-…, MIG-…, unique prefix), PCI bus id, a comma
    list of these, or auto[:N] (the N least-loaded free cards, best connected)."""
    spec = spec.strip()
    if not spec:
        raise UsageError("empty --gpu: expected an index, a UUID, a PCI bus id or auto[:N]")
    if (count := auto_count(spec)) is not None:
        try:
            return list(choose(snapshot, count, topo, min_free, max_util, max_used, taken, preferred).gpus)
        except ValueError as exc:
            held = "".join(f"; GPU {g.index} is {taken[g.ref]}" for g in snapshot.gpus if taken and g.ref in taken)
            raise UsageError(f"--gpu {spec}: {exc}{held}") from None
    chosen: list[GpuSample] = []
    for part in spec.split(","):
        gpu = _one(part.strip(), snapshot, spec)
        if gpu in chosen:
            raise UsageError(f"bad --gpu {spec!r}: card {gpu.index} is named twice")
        chosen.append(gpu)
    try:
        one_vendor(chosen)
    except UsageError as exc:
        raise UsageError(f"bad --gpu {spec!r}: {exc}") from None
    return chosen


def _one(part: str, snapshot: Snapshot, spec: str) -> GpuSample:
    gpus = snapshot.gpus
    if part.isascii() and part.isdigit():  # "¹".isdigit() is true too
        match = [g for g in gpus if g.index == int(part)]
        if not match:
            raise UsageError(f"bad --gpu {spec!r}: no card {part} (cards are {_indices(snapshot)})")
        if match[0].ref is None:  # jobs name cards by UUID (or bus id): a card that never answered has none
            raise UsageError(f"--gpu {spec}: card {part} cannot be used: {match[0].error or match[0].state}")
        return match[0]
    if part.upper().startswith("MIG-"):
        # A MIG slice stands in for its card, under its own UUID and memory, so it is pinned by it.
        match = [m for g in gpus for m in mig_slices(g) if m.uuid and m.uuid.lower().startswith(part.lower())]
        if len(match) == 1:
            return match[0]
        problem = "matches several MIG slices" if match else "matches no MIG slice"
        raise UsageError(f"bad --gpu {spec!r}: {part!r} {problem}")
    if part.upper().startswith("GPU-"):
        match = [g for g in gpus if g.uuid and g.uuid.lower().startswith(part.lower())]
        if len(match) == 1:
            return match[0]
        problem = "matches several cards" if match else "matches no card"
        raise UsageError(f"bad --gpu {spec!r}: UUID {part!r} {problem}")
    if ":" in part:
        match = [g for g in gpus if g.pci_bus_id and _norm_bus(g.pci_bus_id) == _norm_bus(part)]
        if match:
            return match[0]
        raise UsageError(f"bad --gpu {spec!r}: no card at PCI bus id {part!r}")
    raise UsageError(f"bad --gpu {spec!r}: {part!r} is not an index, a UUID, a PCI bus id or auto[:N]")


def _indices(snapshot: Snapshot) -> str:
    return ", ".join(str(g.index) for g in snapshot.gpus) or "none"


def outside_allocation(snapshot: Snapshot, env: Mapping[str, str]) -> dict[str, str]:
    """Cards this environment's allocation does not grant (ref -> why, in words), as placement's
    `taken`: inside a Slurm job or a container, auto, select and the queue choose among its cards."""
    given = granted(snapshot.gpus, env)
    if given is None:
        return {}
    indices, spoken_of, words = given
    return {g.ref: f"outside this allocation ({printable(words)})" for g in snapshot.gpus
            if g.ref and g.index in spoken_of and g.index not in indices}


def own_slurm_job(env: Mapping[str, str]) -> set[str]:
    """The ids that name the Slurm job this environment runs in (JOBID, an array task's
    ARRAYJOB_TASK too); empty outside Slurm."""
    ids = {env.get("SLURM_JOB_ID", "")}
    array, task = env.get("SLURM_ARRAY_JOB_ID", ""), env.get("SLURM_ARRAY_TASK_ID", "")
    if array and task:
        ids.add(f"{array}_{task}")
    return ids - {""}


def allocated_elsewhere(snapshot: Snapshot, env: Mapping[str, str]) -> dict[str, str]:
    """Cards this node's Slurm has given to jobs other than the one this environment runs in (ref
    -> why, in words), as placement's `taken`: a job's card is its own, however idle it looks."""
    ours = own_slurm_job(env)
    return {g.ref: f"allocated by Slurm to job {printable(job.id)}" + (f" ({printable(job.user)})" if job.user else "")
            for g in snapshot.gpus if g.ref and (job := g.allocated_to) is not None and job.id not in ours}


def never_met(spec: str, snapshot: Snapshot, min_free: str | None = None,
              outside: Collection[str] = (), allocated: Mapping[str, str] | None = None) -> str | None:
    """Why no state of this host's cards could ever meet a queued request, or None: more cards
    than it has healthy (within its allocation: `outside` are the cards it does not grant; and
    besides those Slurm has given its jobs, `allocated`: Slurm keeps giving them to its own), or
    more free memory than a card has. A queue must not wait for it."""
    count = auto_count(spec)
    allocated = allocated or {}
    if count is None:
        named = resolve_spec(spec, snapshot)
    else:
        first = snapshot.gpus[0].vendor if snapshot.gpus else DEFAULT_VENDOR
        named = [g for g in snapshot.gpus if g.vendor == first and g.state == "ok" and g.ref not in outside
                 and g.ref not in allocated
                 and not (g.health is not None and g.health.verdict == "fail") and not (g.mig_mode and count > 1)]
        if count > len(named):
            others = [g for g in snapshot.gpus if g not in named]
            why = "; ".join(f"GPU {g.index}: {allocated.get(g.ref or '') or free_enough(g) or 'another vendor'}"
                            for g in others[:3])
            where = "this allocation grants" if any(g.ref in outside for g in snapshot.gpus) else "this host has"
            return (f"--gpu {spec} asks for {count} cards; {where} {len(named)} that could run it"
                    + (f" ({why})" if why else ""))
    if min_free is None or min_free.endswith("%"):
        return None
    needed = parse_size(min_free, None)
    totals = [g.memory_total for g in named if g.memory_total]
    if totals and len([t for t in totals if t >= needed]) < (count or len(named)):
        cards = ("these cards have" if count is None else "any card here has" if count == 1
                 else f"{count} cards here have")
        return f"--min-free {min_free} is more than {cards} (the largest has {format_bytes(max(totals))})"
    return None


def could_use(gpu: GpuSample, cards: Collection[str], min_free: int | None) -> bool:
    """Whether a queued job asking for `cards` (none: any) with `min_free` bytes could ever run on `gpu`."""
    if cards and gpu.ref not in cards and gpu.uuid not in cards:
        return False
    return min_free is None or gpu.memory_total is None or gpu.memory_total >= min_free
