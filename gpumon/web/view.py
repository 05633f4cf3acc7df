"""The page's document: what the browser shows, worked out here once per sample for every viewer.

The page only lays it out: verdicts (health/verdicts, as `gpumon health` tells them), which card
is free (jobs/placement's `free_enough`, as `gpumon select` decides), who holds the cards and who
holds them idle (owners/holders, as the users view says it), sizes in words (units).
Every string from the cards, processes and hosts is made printable here (control and bidi
characters as visible escapes); the page sets it as text, never as markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpumon.health.verdicts import card_verdict
from gpumon.jobs.placement import free_enough
from gpumon.model import FleetSnapshot, GpuSample, ProcessSample, Snapshot
from gpumon.owners.holders import Holder, idle_cell, idle_holders, summary
from gpumon.sanitize import printable
from gpumon.sharing.view import CardSharing, HostSharing, UseWithoutClaim, of, reservations_text, uses_without_claim
from gpumon.units import format_bytes, format_duration, format_energy

COMMAND_CHARS = 200  # a command line this long says enough; the rest is cut with …
PROCESSES_PER_HOST = 200  # the page shows the biggest ones (by GPU memory), and says how many more
HOLDERS_SHOWN = 500  # rows of the users table; the rest are counted (the idle line names every idle one)


def _text(value: str | None, limit: int = 120) -> str | None:
    if value is None:
        return None
    shown = printable(value)
    return shown if len(shown) <= limit else shown[:limit - 1] + "…"


def _owner(proc: ProcessSample) -> str | None:
    return _text(proc.owner.label) if proc.owner is not None else None


def _holders(gpu: GpuSample) -> str | None:
    """Who holds the card: its source's name for it (a pod), else its processes' owners, the
    biggest users of memory first."""
    if gpu.owner:
        return _text(gpu.owner)
    names: dict[str, None] = {}
    for proc in sorted(gpu.processes, key=lambda p: -(p.gpu_memory or 0)):
        who = proc.owner.label if proc.owner is not None and proc.owner.kind != "user" else proc.user
        if who:
            names.setdefault(printable(who), None)
    return _text(", ".join(names)) if names else None


def _card(gpu: GpuSample, card_id: str, key: str, shared: CardSharing | None = None,
          unclaimed: Sequence[UseWithoutClaim] = ()) -> dict[str, Any]:
    verdict = card_verdict(gpu)
    shared = shared or CardSharing()
    busy = free_enough(gpu)
    if busy is None and shared.claims:
        busy = shared.claims[0].words()
    if busy is None and shared.reservation is not None and not shared.reservation.mine:
        busy = shared.reservation.words()
    power = None
    if gpu.power_draw is not None:
        power = f"{gpu.power_draw:.0f} W" + (f" / {gpu.power_limit:.0f} W" if gpu.power_limit else "")
    return {
        "id": card_id, "key": key, "index": gpu.index, "name": _text(gpu.name), "state": gpu.state,
        "util": gpu.utilization_gpu, "mem_pct": None if gpu.memory_percent is None else round(gpu.memory_percent, 1),
        "mem": f"{format_bytes(gpu.memory_used)} / {format_bytes(gpu.memory_total)}",
        "temp": gpu.temperature, "power": power, "owner": _holders(gpu),
        "verdict": verdict.verdict, "reasons": [_text(f"{r.text}: {r.action}", 300) for r in verdict.reasons],
        "free": busy is None, "why_busy": _text(busy, 200), "error": _text(gpu.error),
        "claims": [_text(c.words(), 200) for c in shared.claims],
        "reservation": _text(shared.reservation.words(), 300) if shared.reservation else None,
        "without_claim": [_text(u.words(), 300) for u in unclaimed if u.gpu == gpu.index],
    }


def _processes(gpus: tuple[GpuSample, ...], unclaimed: Sequence[UseWithoutClaim] = ()
               ) -> tuple[list[dict[str, Any]], int]:
    rows = [(gpu, p) for gpu in gpus for p in gpu.processes]
    rows.sort(key=lambda row: -(row[1].gpu_memory or 0))
    on_others = {(u.gpu, u.pid): u for u in unclaimed}
    shown = [{"gpu": gpu.index, "pid": p.pid, "user": _text(p.user, 40), "owner": _owner(p),
              "memory": format_bytes(p.gpu_memory, na=""), "type": p.type, "command": _text(p.command, COMMAND_CHARS),
              "without_claim": _text(on_others[(gpu.index, p.pid)].on(), 200)
              if (gpu.index, p.pid) in on_others else None}
             for gpu, p in rows[:PROCESSES_PER_HOST]]
    return shown, max(0, len(rows) - PROCESSES_PER_HOST)


def host_view(name: str, state: str, snapshot: Snapshot | None, error: str | None = None,
              fleet: bool = False, sharing: HostSharing | None = None) -> dict[str, Any]:
    """One host's section. `state`: "live", "stale", or why its cards are not shown (a fleet
    host's state: connecting, unreachable, …); a host away shows no old cards. `sharing`: this
    host's claims, reservations and queue (gpumon/sharing), known for this machine only."""
    gpus = snapshot.gpus if snapshot is not None and state in ("live", "stale") else ()
    sharing = sharing or HostSharing()
    unclaimed = uses_without_claim(snapshot, sharing.cards) if snapshot is not None and gpus else []
    cards = [_card(g, f"{name}:{g.index}" if fleet else str(g.index), f"{name}/{g.key}", of(g, sharing.cards),
                   unclaimed) for g in gpus]
    processes, more = _processes(gpus, unclaimed)
    return {"name": _text(name), "state": state, "error": _text(error, 300),
            "driver": _text(snapshot.driver_version) if snapshot is not None else None,
            "cards": cards, "processes": processes, "more_processes": more,
            "queue": [{"position": e.position, "text": _text(e.words(numbered=False), 300)} for e in sharing.queue]}


def _summary(hosts: list[dict[str, Any]], fleet: bool) -> dict[str, Any]:
    cards = [c for h in hosts for c in h["cards"]]
    free = sum(c["free"] for c in cards)
    hosts_free = sum(any(c["free"] for c in h["cards"]) for h in hosts)
    if fleet:
        text = (f"{free} card{'' if free == 1 else 's'} free on {hosts_free} host{'' if hosts_free == 1 else 's'} "
                f"(of {len(cards)} cards on {len(hosts)} hosts)")
    else:
        text = f"{free} of {len(cards)} card{'' if len(cards) == 1 else 's'} free"
    bad = {v: sum(c["verdict"] == v for c in cards) for v in ("fail", "warn")}
    return {"free": free, "hosts_free": hosts_free, "cards": len(cards), "text": text,
            "failing": bad["fail"], "warning": bad["warn"],
            "away": sum(h["state"] not in ("live", "stale") for h in hosts)}


def _holder_row(h: Holder, branch: str) -> dict[str, Any]:
    """A row of the users table, as the TUI's users view has it; `branch`: its tree mark under its
    user ("├", "└"; "" for a user)."""
    return {"key": f"{h.host}/{h.kind}/{h.id}", "kind": h.kind, "branch": branch, "idle": h.idle,
            "host": _text(h.host, 60), "who": _text(h.label), "user": _text(h.user or "?", 40),
            "cards": ",".join(map(str, h.cards)) or "-", "memory": format_bytes(h.gpu_memory),
            "sm": "N/A" if h.sm_util is None else str(h.sm_util),
            "power": "N/A" if h.power_w is None else f"{h.power_w:.0f} W",
            "energy": format_energy(h.energy_j, na="N/A"),
            "held": "N/A" if h.held_s is None else format_duration(h.held_s), "idle_for": idle_cell(h)}


def users_view(holders: tuple[Holder, ...], fleet: bool) -> dict[str, Any]:
    """The users section: a row per user, its jobs, pods and containers under it (the tracker lists
    them so), and the line naming who holds cards idle."""
    rows = []
    shown = holders[:HOLDERS_SHOWN]
    for i, h in enumerate(shown):
        branch = ""
        if h.kind != "user":
            following = shown[i + 1] if i + 1 < len(shown) else None
            last = following is None or following.kind == "user" or following.host != h.host
            branch = "└" if last else "├"
        rows.append(_holder_row(h, branch))
    idle, rest = summary(holders, hosts=fleet)
    return {"rows": rows, "more": max(0, len(holders) - HOLDERS_SHOWN), "idle_count": len(idle_holders(holders)),
            "idle": _text(idle, 2000), "rest": rest.removeprefix(" · ")}


def local_view(snapshot: Snapshot, interval: float, holders: tuple[Holder, ...] = (),
               sharing: HostSharing | None = None) -> dict[str, Any]:
    hosts = [host_view(snapshot.host, "stale" if snapshot.stale else "live", snapshot, sharing=sharing)]
    users = users_view(holders, fleet=False)
    booked = {ref: s.reservation for ref, s in (sharing.cards if sharing else {}).items() if s.reservation}
    users["reservations"] = [_text(line, 300) for line in reservations_text(booked)]
    return {"time": snapshot.time, "interval": interval, "fleet": False, "hosts": hosts,
            "summary": _summary(hosts, fleet=False), "users": users}


def fleet_view(doc: FleetSnapshot, interval: float, problems: tuple[str, ...] = (),
               holders: tuple[Holder, ...] = ()) -> dict[str, Any]:
    hosts = [host_view(s.host, s.state, s.snapshot, s.error, fleet=True) for s in doc.hosts]
    return {"time": doc.time, "interval": interval, "fleet": True, "hosts": hosts,
            "summary": _summary(hosts, fleet=True), "problems": [_text(p, 300) for p in problems],
            "users": users_view(holders, fleet=True)}
