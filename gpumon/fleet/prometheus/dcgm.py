"""dcgm-exporter's metrics, as a Prometheus server holds them, made into schema-1 snapshots.

The metric names are dcgm-exporter's (`DCGM_FI_DEV_*`, framebuffer sizes in MiB, PCIe in KB/s:
the exporter's tables, exporter/fields.py and exporter/health.py, read the other way) and
so are the labels: `gpu`, `UUID`, `modelName`, `pci_bus_id`, `DCGM_FI_DRIVER_VERSION`, MIG's
`GPU_I_ID`/`GPU_I_PROFILE`, and the host in `Hostname` (dcgm-exporter 3.x and gpumon's own
exporter) or `hostname` (newer dcgm-exporter), else the `exported_` form of either, else the
scrape target's `instance` (dcgm_hosts; two machines that report one name are two hosts). A card
is known by its UUID within its host. `gpumon watch --prometheus` exports the same names plus
`gpumon_*` ones (lost cards, processes, the age of its newest sample).

The card's owner: with Kubernetes mapping dcgm-exporter names the pod that holds a card in `pod`,
`namespace`, `container`. When the scrape target carries labels of those names itself (a
ServiceMonitor adds the exporter's own pod), Prometheus renames the exporter's to `exported_pod`,
… So the owner is read from the `exported_` labels when there are some, else from the plain ones
unless they name the exporter's own pod (the pod on its `up` series). It is shown as
"namespace/pod (container)", several joined by ", " (a shared card). With HPC job mapping
(`--hpc-job-mapping-dir`; gpumon's own exporter too) it names the job in `hpc_job` (`42`, an
array task `40_3`), read by the same rule (`exported_hpc_job` first) where no pod holds the card,
and shown as "job 42".

Total memory is used + free (+ reserved, when exported). Everything in a query's answer is
untrusted: strings are made printable and cut, numbers must be finite and below DCGM's "blank"
values (no reading), and the numbers of hosts, cards and processes are bounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpumon.exporter.fields import CARD_FIELDS, LOST, read_back
from gpumon.fleet.prometheus.api import Series
from gpumon.fleet.prometheus.dcgm_health import COUNTER_FIELDS, card_health
from gpumon.fleet.prometheus.dcgm_hosts import HOST_LABELS, host_names, host_of, text
from gpumon.fleet.schema import MAX_CARDS, MAX_PROCESSES
from gpumon.health.rules import HealthSettings
from gpumon.model import GpuSample, MigSample, ProcessSample, Snapshot, throttle_names
from gpumon.remote.hosts import MAX_HOSTS
from gpumon.vendors import DEFAULT_VENDOR, known

BACKEND = "prometheus"  # a snapshot's "backend" when it was read through Prometheus

# Metric -> (GpuSample field, factor to the schema's unit, its DCGM blank): the exporter's own
# table (exporter/fields.py), read the other way. Both names of the throttle bitmask: dcgm-exporter
# renamed it with DCGM 3.3.
FIELDS: dict[str, tuple[str, float, float]] = read_back([*CARD_FIELDS, LOST])
FLOAT_FIELDS = {"power_draw", "power_limit"}
_CARD_FIELDS = tuple(dict.fromkeys(n for n, _, _ in FIELDS.values() if n not in ("lost", "memory_reserved")))
SAMPLE_AGE = "gpumon_sample_age_seconds"  # gpumon's exporter: seconds since its newest sample
PROCESS_MEMORY = "gpumon_process_gpu_memory_bytes"  # gpumon's exporter with --prometheus-processes
# Series every exporting card has: its freshness is read from the first of these it has (each one
# more costs Prometheus about 40 ms at 2048 cards). gpumon exports only the last for a lost card.
CARD_METRICS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP", "gpumon_gpu_lost")

KEY_LABELS = (*HOST_LABELS, "instance", "gpu", "GPU_I_ID")
INFO_LABELS = (*KEY_LABELS, "job", "UUID", "modelName", "pci_bus_id", "DCGM_FI_DRIVER_VERSION", "GPU_I_PROFILE",
               "pod", "namespace", "container", "exported_pod", "exported_namespace", "exported_container", "vendor",
               "hpc_job", "exported_hpc_job")
OWNER_LABELS = ("pod", "namespace", "container")
MAX_JOB_ID = 64  # Slurm's ids are a few digits: a longer label is cut there

_SELECTOR = '{__name__=~"' + "|".join((*FIELDS, *COUNTER_FIELDS, SAMPLE_AGE)) + '"}'
# The few queries one refresh makes, whatever the number of hosts (benchmarks/prometheus_source.py
# measured the alternatives: every series with all its labels is 2.5x the bytes and costs
# Prometheus more to encode than this aggregation costs it; a query per host costs more of both):
QUERIES = {
    # Every reading, with only the labels that say whose it is: the bulk of the answer, kept small.
    "values": f'max by (__name__, {", ".join(KEY_LABELS)}) ({_SELECTOR})',
    # One series per card with what names it and the time of its newest sample. timestamp() reads
    # the samples' own times only of a plain selector, hence one per metric.
    "cards": f'max by ({", ".join(INFO_LABELS)}) ({" or ".join(f"timestamp({m})" for m in CARD_METRICS)})',
    "processes": PROCESS_MEMORY,
    # The scrape targets of every job that exports GPU series: which are down, and their own pods.
    "targets": f"up and on (job) group by (job) ({_SELECTOR})",
}
MAX_JOBS = 64


def _regex_literal(text: str) -> str:
    """`text` matched literally by a PromQL regex, inside a double-quoted PromQL string."""
    escaped = "".join("\\" + c if c in ".^$*+?()[]{}|\\" else c for c in text)
    return escaped.replace("\\", "\\\\").replace('"', '\\"')  # the string literal escapes them again


def queries(jobs: Iterable[str] = ()) -> dict[str, str]:
    """QUERIES; once the scrape jobs of GPU series are known (`jobs`, from the last refresh), their
    targets are asked for by job: cheaper, and a job whose every exporter stopped still says which
    ones are down."""
    out = dict(QUERIES)
    known = sorted(set(jobs))[:MAX_JOBS]
    if known:
        out["targets"] = f'up{{job=~"{"|".join(_regex_literal(j) for j in known)}"}}'
    return out

def number(value: Any) -> float | None:
    """A sample's value ("45", "NaN", "+Inf") -> a finite float, or None."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) and abs(out) <= 1e18 else None


def _index(labels: Mapping[str, Any]) -> int | None:
    gpu = labels.get("gpu")
    if isinstance(gpu, str) and gpu.isascii() and gpu.isdigit() and len(gpu) < 6:
        return int(gpu)
    return None


def owner_of(labels: Mapping[str, Any], target: Mapping[str, Any]) -> str | None:
    """"namespace/pod (container)" of the pod holding the card, else "job ID" of the job, or None
    (see the module's doc)."""
    if labels.get("exported_pod"):
        pod = text(labels, "exported_pod")
        namespace = text(labels, "exported_namespace") or text(labels, "namespace")
        container = text(labels, "exported_container") or text(labels, "container")
    else:
        pod = text(labels, "pod")
        if pod is None or labels.get("pod") == target.get("pod"):  # nobody's, or the exporter's own pod
            return _job_of(labels, target)
        namespace, container = text(labels, "namespace"), text(labels, "container")
    return (f"{namespace}/" if namespace else "") + str(pod) + (f" ({container})" if container else "")


def _job_of(labels: Mapping[str, Any], target: Mapping[str, Any]) -> str | None:
    if labels.get("exported_hpc_job"):
        job = text(labels, "exported_hpc_job", MAX_JOB_ID)
    else:
        job = text(labels, "hpc_job", MAX_JOB_ID)
        if job is None or labels.get("hpc_job") == target.get("hpc_job"):  # the scrape target's own label
            return None
    return f"job {job}"


@dataclass
class CardData:
    index: int
    newest: float = 0.0  # unix time of its newest sample in Prometheus
    labels: dict[str, Any] = field(default_factory=dict)
    owners: list[str] = field(default_factory=list)
    values: dict[str, float] = field(default_factory=dict)
    slices: dict[str, CardData] = field(default_factory=dict)  # MIG: GPU_I_ID -> the slice
    processes: list[ProcessSample] = field(default_factory=list)


@dataclass
class HostData:
    name: str
    cards: dict[str, CardData] = field(default_factory=dict)  # by UUID (by "#index" only without one)
    instances: set[str] = field(default_factory=set)  # the scrape targets it comes from
    sample_age: float | None = None  # gpumon's exporter: seconds since its newest sample
    processes: int = 0
    reading: Snapshot | None = None  # snapshot(), made where the answers were read (off the event loop)

    @property
    def newest(self) -> float:
        return max((c.newest for c in self.cards.values()), default=0.0)

    @property
    def scrape(self) -> tuple[tuple[str, float], ...]:
        """Which samples it was made of: when no card has a newer sample, nothing has changed."""
        return tuple((key, c.newest) for key, c in self.cards.items())

    def snapshot(self, health: HealthSettings = HealthSettings()) -> Snapshot:
        driver = next((d for c in self.cards.values() if (d := text(c.labels, "DCGM_FI_DRIVER_VERSION", 64))), None)
        gpus = tuple(_gpu(self.cards[k], health) for k in sorted(self.cards, key=lambda k: (self.cards[k].index, k)))
        return Snapshot(time=self.newest, host=self.name, backend=BACKEND, driver_version=driver,
                        cuda_driver_version=None, gpus=gpus)


@dataclass
class Cluster:
    """One refresh: every host Prometheus has GPU series of, and the scrape targets that are down."""

    time: float  # Prometheus' own clock when it answered
    hosts: dict[str, HostData]
    down: dict[str, str]  # instance -> job of targets whose last scrape failed (up == 0)
    jobs: set[str] = field(default_factory=set)  # the scrape jobs GPU series came from
    dropped_hosts: int = 0
    split: set[str] = field(default_factory=set)  # names two machines report: shown as "name (instance)"


def _value(values: Mapping[str, float], name: str) -> int | float | str | tuple[str, ...] | None:
    value = values.get(name)
    if value is None:
        return None
    if name == "throttle_reasons":
        return throttle_names(int(value)) if 0 <= value < 1 << 32 else None
    if name == "pstate":
        return f"P{int(value)}" if 0 <= value <= 15 else None
    return float(value) if name in FLOAT_FIELDS else round(value)


_SUMMED = ("memory_used", "memory_free", "memory_reserved")


def _gpu(card: CardData, health: HealthSettings) -> GpuSample:
    values = dict(card.values)
    if card.slices:  # a MIG card: dcgm-exporter reads it per slice; the card's memory is theirs together
        for name in _SUMMED:
            parts = [s.values[name] for s in card.slices.values() if name in s.values]
            if name not in values and parts:
                values[name] = sum(parts)
        for part in card.slices.values():
            for name, value in part.values.items():
                values.setdefault(name, value)
    fields = {name: _value(values, name) for name in _CARD_FIELDS}
    used, free = fields["memory_used"], fields["memory_free"]
    total = None if used is None or free is None else used + free + round(values.get("memory_reserved", 0))
    labels = card.labels
    migs = tuple(MigSample(uuid=f"{text(labels, 'UUID', 128) or '?'}/{gi}", name=text(s.labels, "GPU_I_PROFILE") or gi,
                           memory_total=_slice_total(s), memory_used=_value(s.values, "memory_used"))  # type: ignore[arg-type]
                 for gi, s in sorted(card.slices.items()))
    lost = values.get("lost") == 1
    counters, verdict = card_health(values, lost, fields["ecc_errors_uncorrected"], health)  # type: ignore[arg-type]
    return GpuSample(
        index=card.index, uuid=text(labels, "UUID", 128), name=text(labels, "modelName", 128) or "?",  # type: ignore[arg-type]
        pci_bus_id=text(labels, "pci_bus_id", 64), state="lost" if lost else "ok",  # type: ignore[arg-type]
        memory_total=total, owner=", ".join(card.owners) or None, processes=tuple(card.processes),
        mig_devices=migs, vendor=_vendor(labels), counters=counters, health=verdict,
        **fields,  # type: ignore[arg-type]
    )


def _vendor(labels) -> str:
    """gpumon's exporter says whose card it is (AMD and Intel cards too); dcgm-exporter's are NVIDIA's."""
    vendor = text(labels, "vendor", 16)
    return vendor if known(vendor) else DEFAULT_VENDOR


def _slice_total(part: CardData) -> int | None:
    used, free = part.values.get("memory_used"), part.values.get("memory_free")
    if used is None or free is None:
        return None
    return round(used + free + part.values.get("memory_reserved", 0))


def _card(host: HostData, labels: Mapping[str, Any], create: bool) -> CardData | None:
    index = _index(labels)
    if index is None:
        return None
    key = text(labels, "UUID", 128) or f"#{index}"
    card = host.cards.get(key)
    if card is None and not create:  # a series without the UUID (an older gpumon's process): by index
        card = next((c for c in host.cards.values() if c.index == index), None)
    if card is None:
        if not create or len(host.cards) >= MAX_CARDS:
            return None
        card = host.cards[key] = CardData(index)
    gi = text(labels, "GPU_I_ID", 16)
    if gi is None:
        return card
    part = card.slices.get(gi)
    if part is None and create and len(card.slices) < 64:
        part = card.slices[gi] = CardData(index)
    return part


def _raw_key(labels: Mapping[str, Any]) -> tuple[Any, ...]:
    """What names a card (or MIG slice) in every answer, as given: a reading finds its card by it
    without checking its labels again (22,000 readings at 256 hosts)."""
    return tuple(map(labels.get, KEY_LABELS))


def read_cluster(when: float, cards: Iterable[Series], values: Iterable[Series], processes: Iterable[Series],
                 targets: Iterable[Series], before: Mapping[str, tuple[Any, Snapshot]] | None = None,
                 split: Iterable[str] = (), health: HealthSettings = HealthSettings()) -> Cluster:
    """The answers of QUERIES -> every host with its cards. A reading of a card that `cards` did
    not name (it appeared between the queries) waits for the next refresh. `before`: host ->
    (scrape, snapshot) of the last refresh; a host with no new sample since keeps that snapshot
    (Prometheus scrapes less often than gpumon asks: most hosts have not changed). `split`: the
    names shown split before (host_names); `health`: the config's [health], for the verdicts."""
    cards = list(cards)
    names, split_now = host_names(cards, split)
    target_labels: dict[tuple[Any, Any], Mapping[str, Any]] = {}
    down: dict[str, str] = {}
    for labels, up in targets:
        target_labels[(labels.get("instance"), labels.get("job"))] = labels
        if up == 0 and (instance := text(labels, "instance")) is not None:
            down[instance] = text(labels, "job") or "?"
    hosts: dict[str, HostData] = {}
    by_instance: dict[Any, HostData] = {}
    by_key: dict[tuple[Any, ...], CardData] = {}
    dropped: set[str] = set()
    jobs: set[str] = set()
    for labels, newest in cards:
        name = names.get((host_of(labels), labels.get("instance")))
        if name is None:
            continue
        host = hosts.get(name)
        if host is None:
            if len(hosts) >= MAX_HOSTS:
                dropped.add(name)
                continue
            host = hosts[name] = HostData(name)
        card = _card(host, labels, create=True)
        if card is None:
            continue
        by_key[_raw_key(labels)] = card
        if newest > card.newest:
            card.newest = newest
            card.labels = dict(labels)
        owner = owner_of(labels, target_labels.get((labels.get("instance"), labels.get("job")), {}))
        if owner is not None and owner not in card.owners and len(card.owners) < 16:
            card.owners.append(owner)
        if (instance := text(labels, "instance")) is not None:
            host.instances.add(instance)
            by_instance[labels.get("instance")] = host
        if isinstance(job := labels.get("job"), str) and len(jobs) < MAX_JOBS:
            jobs.add(job)
    for host in hosts.values():  # a MIG card's own labels and time are its slices'
        for card in host.cards.values():
            for part in card.slices.values():
                if part.newest > card.newest:
                    card.newest, card.labels = part.newest, {**part.labels, "GPU_I_ID": None}
                for owner in part.owners:
                    if owner not in card.owners and len(card.owners) < 16:
                        card.owners.append(owner)
    for labels, value in values:
        metric = labels.get("__name__")
        if metric == SAMPLE_AGE:  # per host from `watch --hosts --prometheus` (Hostname), else per exporter
            named = any(labels.get(key) for key in HOST_LABELS)
            host = hosts.get(host_of(labels) or "") if named else by_instance.get(labels.get("instance"))
            if host is not None:
                host.sample_age = value
            continue
        spec = FIELDS.get(metric) or COUNTER_FIELDS.get(metric)  # type: ignore[arg-type]
        card = by_key.get(_raw_key(labels)) if spec is not None else None
        if card is not None and value < spec[2]:  # NaN is not less either
            card.values[spec[0]] = value * spec[1]
    _add_processes(hosts, names, processes)
    for name, host in hosts.items():
        last = before.get(name) if before else None
        host.reading = last[1] if last is not None and last[0] == host.scrape else host.snapshot(health)
    return Cluster(when, hosts, down, jobs, len(dropped), split_now)


def _add_processes(hosts: dict[str, HostData], names: Mapping[tuple[str | None, Any], str],
                   processes: Iterable[Series]) -> None:
    by_uuid = {c.labels.get("UUID"): (h, c) for h in hosts.values() for c in h.cards.values() if c.labels.get("UUID")}
    for labels, memory in processes:
        pid = labels.get("pid")
        if not (isinstance(pid, str) and pid.isascii() and pid.isdigit() and 0 < len(pid) < 11):
            continue
        named = any(labels.get(k) for k in HOST_LABELS)
        host = hosts.get(names.get((host_of(labels), labels.get("instance")), "")) if named else None
        card = _card(host, labels, create=False) if host is not None else None
        if card is None and labels.get("UUID") in by_uuid:  # an older gpumon exporter: no host label
            host, card = by_uuid[labels["UUID"]]
        if host is None or card is None or host.processes >= MAX_PROCESSES:
            continue
        host.processes += 1
        card.processes.append(ProcessSample(pid=int(pid), type="compute", gpu_memory=int(memory),
                                            user=text(labels, "user", 64), command=text(labels, "name", 256)))
