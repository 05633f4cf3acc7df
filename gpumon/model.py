"""What gpumon knows about the machine at one instant: immutable, in the units of the JSON schema.

Backends build these, the sampler enriches and publishes them, and every view only reads them.
`None` means "the driver does not say" and is shown as null / "N/A", never as 0.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gpumon.counters import NO_COUNTERS, CardCounters, Health
from gpumon.vendors import DEFAULT_VENDOR

SCHEMA_VERSION = 1

# NVML clock-event (throttle) reason bits, by the names docs/design.md gives them.
THROTTLE_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
}


def throttle_names(mask: int) -> tuple[str, ...]:
    return tuple(name for bit, name in THROTTLE_REASONS.items() if mask & bit)


# Who a process belongs to, most specific first: a Slurm job, a Kubernetes pod, a container of
# Docker or Podman, a systemd unit, or else only its user.
OWNER_KINDS = ("slurm", "k8s", "container", "unit", "user")


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """JSON "owner" of a process (docs/design.md): `id` is the job (`JOBID[.STEP]`, an array task
    `ARRAYJOB_TASK[.STEP]`), the pod's UID, the short container id, the unit, or the user; `name`
    the job's name, `namespace/pod (container)`, or the container's name; `engine` the container's
    engine ("docker", "podman") for kind "container". None: not known."""

    kind: str
    id: str
    name: str | None = None
    user: str | None = None
    engine: str | None = None

    @property
    def label(self) -> str:
        """The short form tables show: `job 4242.0`, `ml/trainer-7f9c (main)`, `docker:llama`, a unit
        (its user has a column of its own), a user."""
        if self.kind == "slurm":
            return f"job {self.id}"
        if self.kind == "k8s":
            return self.name or f"pod {self.id[:8]}"
        if self.kind == "container":
            return f"{self.engine or 'container'}:{self.name or self.id}"
        return self.id

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "name": self.name, "user": self.user, "engine": self.engine}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProcessOwner:
        """Inverse of to_dict (our own recordings); raises TypeError/KeyError on bad data."""
        return cls(kind=str(data["kind"]), id=str(data["id"]), name=data.get("name"), user=data.get("user"),
                   engine=data.get("engine"))


@dataclass(frozen=True, slots=True)
class ProcessSample:
    pid: int
    type: str  # "compute" | "graphics"
    gpu_memory: int | None = None  # bytes
    sm_util: int | None = None  # percent
    user: str | None = None
    command: str | None = None
    cpu_percent: float | None = None
    rss: int | None = None  # bytes
    started: float | None = None  # unix seconds
    # Not in the JSON schema: used by the TUI (may we signal it? which container is it in?).
    uid: int | None = None
    container: str | None = None
    owner: ProcessOwner | None = None  # JSON "owner": None (null) when the process cannot be seen
    container_pid: int | None = None  # its pid in its own PID namespace (a container's); None: the host's

    def with_host_info(self, user: str | None, command: str | None, cpu_percent: float | None, rss: int | None,
                       started: float | None, uid: int | None, container: str | None,
                       owner: ProcessOwner | None, container_pid: int | None) -> ProcessSample:
        """This process with what the OS says of it. Built field by field: dataclasses.replace
        costs more than reading the OS, every sample, for each of hundreds of processes."""
        return ProcessSample(self.pid, self.type, self.gpu_memory, self.sm_util, user, command, cpu_percent, rss,
                             started, uid, container, owner, container_pid)


_NESTED = ("counters", "health")  # objects of their own, not plain JSON values
_PROCESS_JSON_FIELDS = ("pid", "user", "command", "type", "gpu_memory", "sm_util", "cpu_percent", "rss", "started",
                        "container_pid")


def _process_to_dict(p: ProcessSample) -> dict[str, Any]:
    out = {name: getattr(p, name) for name in _PROCESS_JSON_FIELDS}
    out["owner"] = p.owner.to_dict() if p.owner is not None else None
    return out


def _process_from_dict(raw: dict[str, Any], fields: set[str]) -> ProcessSample:
    values = {k: v for k, v in raw.items() if k in fields}
    owner = values.get("owner")
    if owner is not None:
        values["owner"] = ProcessOwner.from_dict(owner)
    return ProcessSample(**values)


@dataclass(frozen=True, slots=True)
class MigSample:
    """A MIG slice of a card: CUDA sees it as a device of its own, named by its MIG UUID."""

    uuid: str
    name: str
    memory_total: int | None = None
    memory_used: int | None = None


# Card makers, as people write them.

# A card's NVSwitch fabric registration (HGX/DGX boards), in words; None: the card has no fabric.
FABRIC_STATES = ("ready", "degraded", "in_progress", "not_started", "failed")


@dataclass(frozen=True, slots=True)
class GpuSample:
    index: int
    uuid: str | None  # None: the card could not be asked (lost or hung from the start)
    name: str
    pci_bus_id: str | None
    # "ok" | "lost" | "error" | "stale" (its driver calls have not answered for `stale_s` seconds:
    # the values are its last answer, if any)
    state: str = "ok"
    utilization_gpu: int | None = None
    utilization_memory: int | None = None
    memory_total: int | None = None
    memory_used: int | None = None
    memory_free: int | None = None
    temperature: int | None = None
    fan: int | None = None
    power_draw: float | None = None  # watts
    power_limit: float | None = None  # watts
    clock_sm: int | None = None  # MHz
    clock_mem: int | None = None  # MHz
    pstate: str | None = None
    throttle_reasons: tuple[str, ...] | None = None
    ecc_errors_uncorrected: int | None = None
    pcie_tx: int | None = None  # bytes/s
    pcie_rx: int | None = None  # bytes/s
    encoder_util: int | None = None
    decoder_util: int | None = None
    numa_node: int | None = None
    cpu_affinity: str | None = None  # "0-15,32-47"
    # Who holds the card when the source knows it by name, not by process: the Kubernetes pod a
    # dcgm-exporter names ("namespace/pod (container)"; several joined by ", "). JSON "owner".
    owner: str | None = None
    processes: tuple[ProcessSample, ...] = ()
    error: str | None = None  # why state is not "ok", for people
    mig_devices: tuple[MigSample, ...] = ()  # not in the JSON schema: for pinning and display
    mig_mode: bool | None = None  # MIG on: CUDA sees the slices, never the whole card
    # Who may open a context (`nvidia-smi -c`): "default", "exclusive_process" (one process at a
    # time: a second fails at its first CUDA call), "exclusive_thread", "prohibited"; None: not told.
    compute_mode: str | None = None
    fabric: str | None = None  # one of FABRIC_STATES; None: no NVSwitch fabric (or not reported)
    stale_s: float | None = None  # with state "stale": seconds since the card last answered
    # Whose card: "nvidia" (NVML), "amd" (amdgpu) or "intel" (i915, xe); AMD and Intel cards are read
    # from the kernel (sysfs and /proc/PID/fdinfo). The fields below are theirs (None from NVML).
    vendor: str = DEFAULT_VENDOR
    temperature_junction: int | None = None  # °C, the hottest spot (AMD); `temperature` is the edge
    temperature_memory: int | None = None  # °C, the memory (AMD HBM/GDDR)
    gtt_total: int | None = None  # bytes of system memory the card can map (AMD GTT)
    gtt_used: int | None = None
    pcie_link_speed: float | None = None  # GT/s, now (a link saves power by slowing down)
    pcie_link_width: int | None = None  # lanes, now
    pcie_link_speed_max: float | None = None
    pcie_link_width_max: int | None = None
    vbios: str | None = None
    serial: str | None = None
    perf_level: str | None = None  # AMD power_dpm_force_performance_level: auto, manual, high, …
    # The kernel has put the card to sleep (runtime PM "suspended"): it is not read, so as not to
    # wake it, and its values are None. None: not known (NVML).
    asleep: bool | None = None
    # Not in the JSON schema: the card's number in its vendor's runtime (ROCm's order for AMD, Level
    # Zero's for Intel), for pinning a job to it. None for NVIDIA (pinned by UUID).
    vendor_index: int | None = None
    # Reliability counters (read every few seconds: the same object between reads) and the verdict
    # drawn from them (gpumon/counters.py); JSON: each counter a key of the card, and "health".
    counters: CardCounters | None = None
    health: Health | None = None
    # Not in the JSON schema: the card's /dev/nvidiaN (NVML's minor number), as a scheduler's
    # device list names it. None: not known (not NVIDIA, or the driver did not say).
    minor_number: int | None = None
    # Not in the JSON schema ("owner" says "job ID"): the Slurm job this host's Slurm has given the
    # whole card (its GRES), whether or not that job's processes are on it yet (owners/slurm_gres.py).
    allocated_to: ProcessOwner | None = None

    @property
    def key(self) -> str:
        """What identifies the card across samples, resets and driver reloads: its UUID."""
        return self.uuid or f"index:{self.index}"

    @property
    def ref(self) -> str | None:
        """How a job names the card: its UUID, or its PCI bus id where the kernel gives no UUID
        (Intel cards, AMD cards without a unique_id); `--gpu` takes either."""
        return self.uuid or self.pci_bus_id

    @property
    def memory_percent(self) -> float | None:
        if self.memory_used is None or not self.memory_total:
            return None
        return 100.0 * self.memory_used / self.memory_total

    @property
    def power_percent(self) -> float | None:
        if self.power_draw is None or not self.power_limit:
            return None
        return 100.0 * self.power_draw / self.power_limit


@dataclass(frozen=True, slots=True)
class Snapshot:
    time: float
    host: str
    backend: str  # "nvml" | "demo" | "replay"
    driver_version: str | None
    cuda_driver_version: str | None
    gpus: tuple[GpuSample, ...] = ()
    # Not part of the schema: set by the sampler when this is old data re-published.
    stale: bool = field(default=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The schema-1 JSON document of docs/design.md."""
        return {
            "schema": SCHEMA_VERSION,
            "time": self.time,
            "host": self.host,
            "backend": self.backend,
            "driver_version": self.driver_version,
            "cuda_driver_version": self.cuda_driver_version,
            "gpus": [_gpu_to_dict(gpu) for gpu in self.gpus],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], backend: str | None = None) -> Snapshot:
        """Inverse of to_dict (for recordings); raises ValueError/TypeError/KeyError on bad data."""
        if data.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema version {data.get('schema')!r}")
        gpu_fields = {f.name for f in dataclasses.fields(GpuSample)} - {"processes", "mig_devices", *_NESTED}
        proc_fields = {f.name for f in dataclasses.fields(ProcessSample)}
        gpus = []
        for raw in data["gpus"]:
            values = {k: v for k, v in raw.items() if k in gpu_fields}
            if values.get("throttle_reasons") is not None:
                values["throttle_reasons"] = tuple(values["throttle_reasons"])
            procs = tuple(_process_from_dict(p, proc_fields) for p in raw.get("processes", ()))
            gpus.append(GpuSample(**values, processes=procs, counters=CardCounters.from_dict(raw),
                                  health=Health.from_dict(raw.get("health"))))
        return cls(
            time=float(data["time"]),
            host=str(data["host"]),
            backend=backend or str(data["backend"]),
            driver_version=data.get("driver_version"),
            cuda_driver_version=data.get("cuda_driver_version"),
            gpus=tuple(gpus),
        )


def _gpu_to_dict(gpu: GpuSample) -> dict[str, Any]:
    out = {f.name: getattr(gpu, f.name) for f in dataclasses.fields(GpuSample)}
    out.pop("error")
    out.pop("mig_devices")
    out.pop("vendor_index")
    out.pop("minor_number")
    out.pop("allocated_to")
    if gpu.throttle_reasons is not None:
        out["throttle_reasons"] = list(gpu.throttle_reasons)
    out["processes"] = [_process_to_dict(p) for p in gpu.processes]
    out.pop("counters")
    out.pop("health")
    out.update(gpu.counters.to_dict() if gpu.counters is not None else NO_COUNTERS)
    out["health"] = gpu.health.to_dict() if gpu.health is not None else None
    return out


@dataclass(frozen=True, slots=True)
class Topology:
    """How the cards connect. `links[i][j]` uses nvidia-smi's legend: X, NV#, PIX, PXB, PHB, NODE, SYS
    (None: not known, e.g. still being read). NV# counts direct NVLinks, or for cards wired to NVSwitches
    (HGX/DGX) the links each has into the switch fabric, as `nvidia-smi topo -m` does."""

    indices: tuple[int, ...]
    links: tuple[tuple[str | None, ...], ...]
    nvlinks: tuple[tuple[int, ...], ...]  # NVLinks joining each pair (direct or through NVSwitches)
    cpu_affinity: tuple[str | None, ...]
    numa_node: tuple[int | None, ...]
    left_out: tuple[tuple[int, str], ...] = ()  # cards not in the matrix, and why
    nvswitch: tuple[bool, ...] = ()  # per card: its NVLinks go to NVSwitches
    unknown: tuple[tuple[int, str], ...] = ()  # cards in the matrix of which links are not known, and why

    def to_dict(self) -> dict[str, Any]:
        return {
            "left_out": [{"index": index, "reason": reason} for index, reason in self.left_out],
            "unknown": [{"index": index, "reason": reason} for index, reason in self.unknown],
            "gpus": [
                {
                    "index": idx,
                    "links": {str(other): self.links[i][j] for j, other in enumerate(self.indices)},
                    "nvlinks": {str(other): self.nvlinks[i][j] for j, other in enumerate(self.indices)
                                if self.nvlinks[i][j]},
                    "cpu_affinity": self.cpu_affinity[i],
                    "numa_node": self.numa_node[i],
                    "nvswitch": bool(self.nvswitch and self.nvswitch[i]),
                }
                for i, idx in enumerate(self.indices)
            ]
        }


# -- many hosts (the fleet) --

# What a fleet host is doing, for people: connecting (first try), live, stale (no data for three
# intervals, at least 2 s), reconnecting (after a failure, with backoff), unreachable (the last try failed: `error`
# says why), error (it answered, but with something unusable: `error` says what).
HOST_STATES = ("connecting", "live", "stale", "reconnecting", "unreachable", "error")
# The same, as the fleet document of docs/design.md says it.
_DOCUMENT_STATE = {"live": "ok", "stale": "stale", "error": "error"}


@dataclass(frozen=True, slots=True)
class HostStatus:
    """One host of the fleet: its state and its latest snapshot (kept while it is stale or away)."""

    host: str  # the entry as the user listed it: an ssh destination, alias or "local"
    state: str = "connecting"
    source: str = "gpumon"  # "gpumon" | "nvidia-smi" | "prometheus" | "local"
    snapshot: Snapshot | None = None
    error: str | None = None  # why it is not live, in words
    since: float = 0.0  # when `state` began (unix s)
    note: str | None = None  # what people should know, e.g. that launching needs gpumon there
    retry_at: float | None = None  # unreachable: when the next try starts (unix s)
    # Its cards that others hold, as the host said with its snapshot: (card ref, who, in words) for
    # each claimed or reserved by someone else, and the refs of those the user reserved.
    taken: tuple[tuple[str, str], ...] = ()
    mine: frozenset[str] = frozenset()

    @property
    def can_launch(self) -> bool:
        """Jobs, logs and signals need gpumon on the host (or this machine)."""
        return self.source in ("gpumon", "local")

    @property
    def launch_refusal(self) -> str | None:
        """Why `r` (or `run --host`) cannot launch here, for people; None when it can."""
        if self.can_launch:
            return None
        return self.note or f"read through {self.source}: launching needs gpumon there, over ssh"

    def card_id(self, index: int) -> str:
        return f"{self.host}:{index}"

    def to_dict(self) -> dict[str, Any]:
        state = _DOCUMENT_STATE.get(self.state, "unreachable")
        error = self.error if state != "ok" else None
        if state == "unreachable" and error is None:
            error = "no answer yet" if self.state == "connecting" else "unreachable"
        # Old data of a host that is away is not a reading: the TUI keeps it, the document does not.
        shown = self.snapshot if state in ("ok", "stale") else None
        return {"host": self.host, "state": state, "error": error, "source": self.source,
                "snapshot": shown.to_dict() if shown is not None else None}


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """Every host at one instant: `snapshot --json --hosts` prints its to_dict()."""

    time: float
    hosts: tuple[HostStatus, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA_VERSION, "time": self.time, "hosts": [h.to_dict() for h in self.hosts]}
