"""Documents from other hosts, checked before they become `Snapshot`s.

Everything a remote host sends is untrusted: a broken or hostile gpumon (or something else on
the remote PATH called gpumon) must not crash this one, fill its memory, or put terminal control
sequences on the screen. So every field is checked for its type and range, every string is made
printable and cut to a sane length, lists are bounded, and unknown keys are ignored (a newer
gpumon may add some). Anything else raises SchemaError with what was wrong.
"""

from __future__ import annotations

import math
from typing import Any

from gpumon.model import SCHEMA_VERSION, THROTTLE_REASONS, GpuSample, ProcessSample, Snapshot, Topology
from gpumon.sanitize import printable

MAX_CARDS = 256
MAX_PROCESSES = 20000  # per host
MAX_TEXT = 1024
GPU_STATES = ("ok", "lost", "error", "stale")
BACKENDS = ("nvml", "demo", "replay")
_THROTTLE_NAMES = frozenset(THROTTLE_REASONS.values())

_INT_FIELDS = ("utilization_gpu", "utilization_memory", "memory_total", "memory_used", "memory_free", "temperature",
               "fan", "clock_sm", "clock_mem", "ecc_errors_uncorrected", "pcie_tx", "pcie_rx", "encoder_util",
               "decoder_util", "numa_node")
_FLOAT_FIELDS = ("power_draw", "power_limit")
_TEXT_FIELDS = ("pstate", "cpu_affinity")


class SchemaError(ValueError):
    """A document this gpumon cannot use; the message says what was wrong."""


def _text(value: Any, where: str, nullable: bool = True, limit: int = MAX_TEXT) -> str | None:
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise SchemaError(f"{where} is not text")
    return printable(value[:limit])


def _number(value: Any, where: str, integer: bool = False) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SchemaError(f"{where} is not a number")
    if isinstance(value, float) and not math.isfinite(value):
        raise SchemaError(f"{where} is not a finite number")
    if abs(value) > 1e18:
        raise SchemaError(f"{where} is out of range")
    return int(value) if integer else float(value)


def _list(value: Any, where: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise SchemaError(f"{where} is not a list")
    if len(value) > limit:
        raise SchemaError(f"{where} has {len(value)} entries (at most {limit})")
    return value


def _process(raw: Any, where: str) -> ProcessSample:
    if not isinstance(raw, dict):
        raise SchemaError(f"{where} is not an object")
    pid = _number(raw.get("pid"), f"{where}.pid", integer=True)
    if pid is None or pid <= 0:
        raise SchemaError(f"{where}.pid is missing")
    kind = raw.get("type")
    if kind not in ("compute", "graphics"):
        raise SchemaError(f"{where}.type is not compute or graphics")
    return ProcessSample(
        pid=int(pid), type=kind, gpu_memory=_number(raw.get("gpu_memory"), f"{where}.gpu_memory", integer=True),
        sm_util=_number(raw.get("sm_util"), f"{where}.sm_util", integer=True),
        user=_text(raw.get("user"), f"{where}.user", limit=64),
        command=_text(raw.get("command"), f"{where}.command", limit=4096),
        cpu_percent=_number(raw.get("cpu_percent"), f"{where}.cpu_percent"),
        rss=_number(raw.get("rss"), f"{where}.rss", integer=True),
        started=_number(raw.get("started"), f"{where}.started"),
    )


def _gpu(raw: Any, where: str, budget: list[int]) -> GpuSample:
    if not isinstance(raw, dict):
        raise SchemaError(f"{where} is not an object")
    index = _number(raw.get("index"), f"{where}.index", integer=True)
    if index is None or index < 0:
        raise SchemaError(f"{where}.index is missing")
    state = raw.get("state", "ok")
    if state not in GPU_STATES:
        raise SchemaError(f"{where}.state {printable(str(state))[:20]!r} is unknown")
    values: dict[str, Any] = {name: _number(raw.get(name), f"{where}.{name}", integer=True) for name in _INT_FIELDS}
    values.update({name: _number(raw.get(name), f"{where}.{name}") for name in _FLOAT_FIELDS})
    values.update({name: _text(raw.get(name), f"{where}.{name}", limit=256) for name in _TEXT_FIELDS})
    reasons = raw.get("throttle_reasons")
    if reasons is not None:
        names = _list(reasons, f"{where}.throttle_reasons", 64)
        values["throttle_reasons"] = tuple(n for n in names if isinstance(n, str) and n in _THROTTLE_NAMES)
    processes = _list(raw.get("processes", []), f"{where}.processes", MAX_PROCESSES)
    budget[0] -= len(processes)
    if budget[0] < 0:
        raise SchemaError(f"more than {MAX_PROCESSES} processes")
    return GpuSample(
        index=int(index), uuid=_text(raw.get("uuid"), f"{where}.uuid", limit=128),  # type: ignore[arg-type]
        name=_text(raw.get("name"), f"{where}.name", limit=128) or "?",
        pci_bus_id=_text(raw.get("pci_bus_id"), f"{where}.pci_bus_id", limit=64),  # type: ignore[arg-type]
        owner=_text(raw.get("owner"), f"{where}.owner", limit=512),
        state=state, processes=tuple(_process(p, f"{where}.processes[{i}]") for i, p in enumerate(processes)),
        **values,
    )


def snapshot_from_remote(doc: Any) -> Snapshot:
    """A schema-1 document from another host -> Snapshot; SchemaError when it is not one."""
    if not isinstance(doc, dict):
        raise SchemaError("not a JSON object")
    if doc.get("schema") != SCHEMA_VERSION:
        version = doc.get("schema")
        shown = printable(str(version))[:20] if version is not None else "none"
        raise SchemaError(f"schema {shown} is unknown here (this gpumon reads schema {SCHEMA_VERSION}): "
                          "install the same gpumon version on both sides")
    when = _number(doc.get("time"), "time")
    if when is None:
        raise SchemaError("time is missing")
    backend = doc.get("backend")
    if backend not in BACKENDS:
        raise SchemaError("backend is unknown")
    budget = [MAX_PROCESSES]
    gpus = tuple(_gpu(g, f"gpus[{i}]", budget) for i, g in enumerate(_list(doc.get("gpus"), "gpus", MAX_CARDS)))
    return Snapshot(
        time=float(when), host=_text(doc.get("host"), "host", limit=256) or "?", backend=backend,
        driver_version=_text(doc.get("driver_version"), "driver_version", limit=64),
        cuda_driver_version=_text(doc.get("cuda_driver_version"), "cuda_driver_version", limit=64),
        gpus=gpus,
    )


_LINKS = frozenset({"X", "NV", "PIX", "PXB", "PHB", "NODE", "SYS"})


def topology_from_remote(doc: Any) -> Topology:
    """`gpumon topo --json` from another host -> Topology (for placing multi-card jobs there)."""
    if not isinstance(doc, dict):
        raise SchemaError("not a JSON object")
    cards = _list(doc.get("gpus"), "gpus", MAX_CARDS)
    indices = []
    for i, card in enumerate(cards):
        if not isinstance(card, dict) or not isinstance(card.get("links"), dict):
            raise SchemaError(f"gpus[{i}] is not a card with links")
        index = _number(card.get("index"), f"gpus[{i}].index", integer=True)
        if index is None:
            raise SchemaError(f"gpus[{i}].index is missing")
        indices.append(int(index))
    links, nvlinks = [], []
    for card in cards:
        row = []
        for other in indices:
            level = card["links"].get(str(other))
            ok = isinstance(level, str) and (level in _LINKS or (level.startswith("NV") and level[2:].isdigit()))
            row.append(level if ok else None)
        links.append(tuple(row))
        counts = card.get("nvlinks") if isinstance(card.get("nvlinks"), dict) else {}
        nvlinks.append(tuple(int(c) if isinstance(c := counts.get(str(o), 0), int) and not isinstance(c, bool)
                             and 0 <= c < 64 else 0 for o in indices))
    return Topology(
        indices=tuple(indices), links=tuple(links), nvlinks=tuple(nvlinks),
        cpu_affinity=tuple(_text(c.get("cpu_affinity"), "cpu_affinity", limit=256) for c in cards),
        numa_node=tuple(_number(c.get("numa_node"), "numa_node", integer=True) for c in cards),  # type: ignore[misc]
    )


JOB_STATES = ("queued", "running", "exited", "failed", "cancelled", "killed", "lost")
MAX_JOBS = 10000


def jobs_from_remote(doc: Any) -> list[dict[str, Any]]:
    """`gpumon jobs --json` from another host, checked and made printable (same keys)."""
    out = []
    for i, raw in enumerate(_list(doc, "jobs", MAX_JOBS)):
        where = f"jobs[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("id"), str):
            raise SchemaError(f"{where} is not a job")
        state = raw.get("state")
        if state not in JOB_STATES:
            raise SchemaError(f"{where}.state is unknown")
        job: dict[str, Any] = {"id": _text(raw["id"], f"{where}.id", limit=64), "state": state}
        for key in ("name", "log", "reason", "signal", "host"):
            job[key] = _text(raw.get(key), f"{where}.{key}", limit=512 if key != "reason" else 1024)
        for key in ("pid", "exit_code", "mem_limit", "peak_gpu_memory"):
            job[key] = _number(raw.get(key), f"{where}.{key}", integer=True)
        for key in ("started", "ended"):
            job[key] = _number(raw.get(key), f"{where}.{key}")
        job["command"] = [_text(a, f"{where}.command", nullable=False, limit=4096)
                          for a in _list(raw.get("command", []), f"{where}.command", 4096)]
        job["gpus"] = [_text(u, f"{where}.gpus", nullable=False, limit=128)
                       for u in _list(raw.get("gpus", []), f"{where}.gpus", 256)]
        job["gpu_indices"] = [_number(n, f"{where}.gpu_indices", integer=True)
                              for n in _list(raw.get("gpu_indices", []), f"{where}.gpu_indices", 256)]
        out.append(job)
    return out
