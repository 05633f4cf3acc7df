"""Documents from other hosts, checked before they become `Snapshot`s.

Everything a remote host sends is untrusted: a broken or hostile gpumon (or something else on
the remote PATH called gpumon) must not crash this one, fill its memory, or put terminal control
sequences on the screen. So every field is checked for its type and range, every string is made
printable and cut to a sane length, lists are bounded, and unknown keys are ignored (a newer
gpumon may add some). Anything else raises SchemaError with what was wrong.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gpumon.counters import (
    CLOCK_EVENT_TIMES,
    ENERGY_SOURCES,
    VERDICTS,
    CardCounters,
    Health,
    HealthReason,
    recovery_action_value,
)
from gpumon.model import (
    FABRIC_STATES,
    OWNER_KINDS,
    SCHEMA_VERSION,
    THROTTLE_REASONS,
    GpuSample,
    ProcessOwner,
    ProcessSample,
    Snapshot,
    Topology,
)
from gpumon.sanitize import printable
from gpumon.vendors import DEFAULT_VENDOR

MAX_CARDS = 256
MAX_PROCESSES = 20000  # per host
MAX_TEXT = 1024
GPU_STATES = ("ok", "lost", "error", "stale")
BACKENDS = ("nvml", "demo", "replay", "drm")
_THROTTLE_NAMES = frozenset(THROTTLE_REASONS.values())

def fields_by_type(cls: type, apart: frozenset[str], *types: str) -> tuple[tuple[str, ...], ...]:
    """The fields of a model dataclass annotated with each of `types`, less those `apart` (read one
    by one, or never); any other field is a TypeError, so that none is dropped unseen."""
    found: dict[str, list[str]] = {t: [] for t in types}
    for f in dataclasses.fields(cls):
        if f.name not in apart:
            if f.type not in found:
                raise TypeError(f"{cls.__name__}.{f.name} ({f.type}): read it in fleet/schema.py or name it apart")
            found[f.type].append(f.name)
    return tuple(tuple(names) for names in found.values())


# Read one by one in _gpu, but for the last three: never sent (model._gpu_to_dict leaves them out).
GPU_APART = frozenset({"index", "uuid", "name", "pci_bus_id", "owner", "state", "processes", "throttle_reasons",
                       "fabric", "mig_mode", "asleep", "vendor", "counters", "health", "error", "mig_devices",
                       "vendor_index", "minor_number", "allocated_to"})
COUNTER_APART = frozenset({"recovery_action", "energy_source", "clock_event_s"})  # read one by one in _counters
_INT, _FLOAT, _TEXT, _FLAG = "int | None", "float | None", "str | None", "bool | None"
_INT_FIELDS, _FLOAT_FIELDS, _TEXT_FIELDS = fields_by_type(GpuSample, GPU_APART, _INT, _FLOAT, _TEXT)
_COUNTER_INTS, _COUNTER_FLOATS, _COUNTER_FLAGS = fields_by_type(CardCounters, COUNTER_APART, _INT, _FLOAT, _FLAG)
MAX_REASONS = 32


class SchemaError(ValueError):
    """A document this gpumon cannot use; the message says what was wrong."""


# Paths like "gpus[3].temperature" are made only for an error's message: a fleet of 256 hosts
# checks 300,000 fields a second, and formatting each one's path cost more than checking it.

def _at(where: str, name: str) -> str:
    return f"{where}.{name}" if name else where


def _text(value: Any, where: str, name: str = "", nullable: bool = True, limit: int = MAX_TEXT) -> str | None:
    if type(value) is str and len(value) <= limit and value.isascii() and value.isprintable():
        return value  # the common case, decided at C speed
    if value is None and nullable:
        return None
    if type(value) is not str:
        raise SchemaError(f"{_at(where, name)} is not text")
    return printable(value[:limit])


_LIMIT = 1e18


def _number(value: Any, where: str, name: str = "", integer: bool = False) -> float | int | None:
    if value is None:
        return None
    kind = type(value)  # JSON gives int, float or bool (which is not a number here)
    if kind is int:
        if -_LIMIT <= value <= _LIMIT:
            return value if integer else float(value)
    elif kind is float:
        if -_LIMIT <= value <= _LIMIT:  # false for NaN and the infinities too
            return int(value) if integer else value
        if not math.isfinite(value):
            raise SchemaError(f"{_at(where, name)} is not a finite number")
    else:
        raise SchemaError(f"{_at(where, name)} is not a number")
    raise SchemaError(f"{_at(where, name)} is out of range")


def _list(value: Any, where: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise SchemaError(f"{where} is not a list")
    if len(value) > limit:
        raise SchemaError(f"{where} has {len(value)} entries (at most {limit})")
    return value


def _process(raw: Any, gpu: str, i: int) -> ProcessSample:
    if type(raw) is not dict:
        raise SchemaError(f"{gpu}.processes[{i}] is not an object")
    get = raw.get
    try:
        pid = _number(get("pid"), "pid", integer=True)
        if pid is None or pid <= 0:
            raise SchemaError("pid is missing")
        kind = get("type")
        if kind not in ("compute", "graphics"):
            raise SchemaError("type is not compute or graphics")
        return ProcessSample(
            pid=int(pid), type=kind, gpu_memory=_number(get("gpu_memory"), "gpu_memory", integer=True),
            sm_util=_number(get("sm_util"), "sm_util", integer=True),
            user=_text(get("user"), "user", limit=64),
            command=_text(get("command"), "command", limit=4096),
            cpu_percent=_number(get("cpu_percent"), "cpu_percent"),
            rss=_number(get("rss"), "rss", integer=True),
            started=_number(get("started"), "started"),
            owner=_owner(get("owner")),
            container_pid=_number(get("container_pid"), "container_pid", integer=True),
        )
    except SchemaError as exc:  # the field's name, within its process: "gpus[0].processes[2].pid …"
        raise SchemaError(f"{gpu}.processes[{i}].{exc}") from None


def _owner(raw: Any) -> ProcessOwner | None:
    """A process's owner (absent from older gpumons); one of a kind this gpumon does not know
    (a newer one's) is left out, not an error."""
    if raw is None:
        return None
    if type(raw) is not dict:
        raise SchemaError("owner is not an object")
    kind = raw.get("kind")
    if kind not in OWNER_KINDS:
        return None
    ident = _text(raw.get("id"), "owner", "id", nullable=False, limit=256)
    return ProcessOwner(kind=kind, id=ident or "?", name=_text(raw.get("name"), "owner", "name", limit=512),
                        user=_text(raw.get("user"), "owner", "user", limit=64),
                        engine=_text(raw.get("engine"), "owner", "engine", limit=32))


def _gpu(raw: Any, where: str, budget: list[int]) -> GpuSample:
    if type(raw) is not dict:
        raise SchemaError(f"{where} is not an object")
    get = raw.get
    index = _number(get("index"), where, "index", integer=True)
    if index is None or index < 0:
        raise SchemaError(f"{where}.index is missing")
    state = get("state", "ok")
    if state not in GPU_STATES:
        raise SchemaError(f"{where}.state {printable(str(state))[:20]!r} is unknown")
    values: dict[str, Any] = {}
    for name in _INT_FIELDS:
        value = get(name)
        # The common case inline (a fleet checks hundreds of thousands of fields a second); the
        # rest, and every error, goes through _number.
        values[name] = value if value is None or (type(value) is int and -_LIMIT <= value <= _LIMIT) \
            else _number(value, where, name, integer=True)
    for name in _FLOAT_FIELDS:
        value = get(name)
        values[name] = value if value is None or (type(value) is float and -_LIMIT <= value <= _LIMIT) \
            else _number(value, where, name)
    for name in _TEXT_FIELDS:
        values[name] = _text(get(name), where, name, limit=256)
    reasons = get("throttle_reasons")
    if reasons is not None:
        names = _list(reasons, f"{where}.throttle_reasons", 64)
        values["throttle_reasons"] = tuple(n for n in names if isinstance(n, str) and n in _THROTTLE_NAMES)
    fabric = get("fabric")
    values["fabric"] = fabric if fabric in FABRIC_STATES else None
    mig_mode = get("mig_mode")
    values["mig_mode"] = mig_mode if type(mig_mode) is bool else None
    asleep = get("asleep")
    values["asleep"] = asleep if type(asleep) is bool else None
    values["vendor"] = _text(get("vendor") or DEFAULT_VENDOR, where, "vendor", nullable=False, limit=16)
    values["counters"] = _counters(raw, where)
    values["health"] = _health(get("health"), where)
    processes = _list(get("processes", []), f"{where}.processes", MAX_PROCESSES)
    budget[0] -= len(processes)
    if budget[0] < 0:
        raise SchemaError(f"more than {MAX_PROCESSES} processes")
    return GpuSample(
        index=int(index), uuid=_text(get("uuid"), where, "uuid", limit=128),  # type: ignore[arg-type]
        name=_text(get("name"), where, "name", limit=128) or "?",
        pci_bus_id=_text(get("pci_bus_id"), where, "pci_bus_id", limit=64),  # type: ignore[arg-type]
        owner=_text(get("owner"), where, "owner", limit=512),
        state=state, processes=tuple(_process(p, where, i) for i, p in enumerate(processes)),
        **values,
    )


def _counters(raw: dict[str, Any], where: str) -> CardCounters | None:
    """A card's health counters; None when it has none (an older gpumon)."""
    get = raw.get
    found: dict[str, Any] = {}
    for name in _COUNTER_INTS:
        value = get(name)
        if value is not None:
            found[name] = value if type(value) is int and -_LIMIT <= value <= _LIMIT \
                else _number(value, where, name, integer=True)
    for name in _COUNTER_FLOATS:
        value = get(name)
        if value is not None:
            found[name] = _number(value, where, name)
    for name in _COUNTER_FLAGS:
        value = get(name)
        if value is not None:
            if type(value) is not bool:
                raise SchemaError(f"{where}.{name} is not true or false")
            found[name] = value
    action = get("recovery_action")
    if action is not None:
        if type(action) is not str or recovery_action_value(action) is None:
            raise SchemaError(f"{where}.recovery_action is not a recovery action")
        found["recovery_action"] = action
    source = get("energy_source")
    if source in ENERGY_SOURCES and "energy_j" in found:
        found["energy_source"] = source
    times = get("clock_event_s")
    if times is not None:
        if type(times) is not dict:
            raise SchemaError(f"{where}.clock_event_s is not an object")
        found["clock_event_s"] = tuple(_number(times.get(name), where, f"clock_event_s.{name}")
                                       for name in CLOCK_EVENT_TIMES)
    return CardCounters(**found) if found else None


def _health(raw: Any, where: str) -> Health | None:
    if raw is None:
        return None
    if type(raw) is not dict or raw.get("verdict") not in VERDICTS:
        raise SchemaError(f"{where}.health is not a verdict")
    reasons = []
    for i, reason in enumerate(_list(raw.get("reasons", []), f"{where}.health.reasons", MAX_REASONS)):
        if type(reason) is not dict:
            raise SchemaError(f"{where}.health.reasons[{i}] is not an object")
        at = f"{where}.health.reasons[{i}]"
        reasons.append(HealthReason(_text(reason.get("code"), at, "code", limit=64) or "?",
                                    _text(reason.get("text"), at, "text", limit=512) or "",
                                    _text(reason.get("action"), at, "action", limit=512) or ""))
    return Health(raw["verdict"], tuple(reasons))


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


_LINKS = frozenset({"X", "NV", "XGMI", "PIX", "PXB", "PHB", "NODE", "SYS"})


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
        left_out=_card_notes(doc, "left_out"), unknown=_card_notes(doc, "unknown"),
    )


def _card_notes(doc: dict, key: str) -> tuple[tuple[int, str], ...]:
    """`left_out`, `unknown`: [{"index", "reason"}] (absent from older gpumons: none)."""
    notes = []
    for i, note in enumerate(_list(doc.get(key, []), key, MAX_CARDS)):
        if not isinstance(note, dict):
            raise SchemaError(f"{key}[{i}] is not an object")
        index = _number(note.get("index"), f"{key}[{i}].index", integer=True)
        if index is not None:
            notes.append((int(index), _text(note.get("reason"), f"{key}[{i}].reason", limit=512) or "?"))
    return tuple(notes)


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
        for key in ("name", "log", "reason", "signal", "host", "runs_on"):
            job[key] = _text(raw.get(key), f"{where}.{key}", limit=512 if key != "reason" else 1024)
        for key in ("pid", "exit_code", "mem_limit", "peak_gpu_memory"):
            job[key] = _number(raw.get(key), f"{where}.{key}", integer=True)
        for key in ("started", "ended", "energy_j"):
            job[key] = _number(raw.get(key), f"{where}.{key}")
        shared = raw.get("energy_shared")
        if shared is not None and type(shared) is not bool:
            raise SchemaError(f"{where}.energy_shared is not true, false or null")
        job["energy_shared"] = shared
        supervised = raw.get("supervised")  # false: its supervisor is gone while it runs
        if supervised is not None and type(supervised) is not bool:
            raise SchemaError(f"{where}.supervised is not true, false or null")
        job["supervised"] = supervised
        job["mem_limits"] = _limits(raw.get("mem_limits", {}), f"{where}.mem_limits")
        job["command"] = [_text(a, f"{where}.command", nullable=False, limit=4096)
                          for a in _list(raw.get("command", []), f"{where}.command", 4096)]
        job["gpus"] = [_text(u, f"{where}.gpus", nullable=False, limit=128)
                       for u in _list(raw.get("gpus", []), f"{where}.gpus", 256)]
        job["gpu_indices"] = _indices(raw.get("gpu_indices", []), f"{where}.gpu_indices")
        failover = _number(raw.get("failover", 0), f"{where}.failover", integer=True)
        job["failover"] = max(0, failover or 0)
        job["attempts"] = [_attempt(a, f"{where}.attempts[{n}]")
                           for n, a in enumerate(_list(raw.get("attempts", []), f"{where}.attempts", MAX_ATTEMPTS))]
        out.append(job)
    return out


MAX_ATTEMPTS = 1000
MAX_SUMMARY = 32  # lines


def launched_from_remote(doc: Any) -> tuple[dict[str, Any], list[str]]:
    """`gpumon run --json` from another host: the job it started (checked as a `jobs --json` entry)
    and its lines for people."""
    if not isinstance(doc, dict):
        raise SchemaError("the answer is not an object")
    (job,) = jobs_from_remote([doc.get("job")])
    summary = [_text(line, "summary", nullable=False, limit=MAX_TEXT)
               for line in _list(doc.get("summary", []), "summary", MAX_SUMMARY)]
    return job, summary


def _limits(value: Any, where: str) -> dict[str, int]:
    """A job's memory limit per card: {uuid: bytes}."""
    if not isinstance(value, dict) or len(value) > 256:
        raise SchemaError(f"{where} is not a map of cards to limits")
    out = {}
    for uuid, limit in value.items():
        if (bytes_ := _number(limit, where, integer=True)) is not None:
            out[_text(uuid, where, nullable=False, limit=128)] = bytes_
    return out


def _indices(value: Any, where: str) -> list[int]:
    return [_number(n, where, integer=True) for n in _list(value, where, 256)]


def _attempt(raw: Any, where: str) -> dict[str, Any]:
    """One start of a job's command, as `gpumon jobs --json` lists it (docs/design.md "Jobs")."""
    if not isinstance(raw, dict):
        raise SchemaError(f"{where} is not an attempt")
    out: dict[str, Any] = {"attempt": _number(raw.get("attempt"), f"{where}.attempt", integer=True)}
    out["gpus"] = [_text(u, f"{where}.gpus", nullable=False, limit=128)
                   for u in _list(raw.get("gpus", []), f"{where}.gpus", 256)]
    out["gpu_indices"] = _indices(raw.get("gpu_indices", []), f"{where}.gpu_indices")
    for key in ("pid", "exit_code"):
        out[key] = _number(raw.get(key), f"{where}.{key}", integer=True)
    for key in ("started", "ended"):
        out[key] = _number(raw.get(key), f"{where}.{key}")
    out["signal"] = _text(raw.get("signal"), f"{where}.signal", limit=64)
    out["moved_because"] = _text(raw.get("moved_because"), f"{where}.moved_because", limit=1024)
    return out
