"""Prometheus: the exposition `watch --prometheus` serves (the exported alerting rules over these
series are alerting/prometheus_rules.py's).

Metric names follow dcgm-exporter 3.x (the `DCGM_FI_DEV_*` fields of its default counters file,
framebuffer sizes in MiB) with its labels `gpu`, `UUID`, `device`, `modelName`, `Hostname`,
`pci_bus_id`, so dashboards and rules written for dcgm-exporter work unchanged, and its `hpc_job`,
`pod`, `namespace`, `container` for who holds the card (prometheus_owners) on every reading of a
card and every process. gpumon's own metrics are prefixed `gpumon_`.

XIDs are events: `DCGM_FI_DEV_XID_ERRORS` keeps dcgm-exporter's meaning (the last XID's code, for
dashboards), and `gpumon_xid_last_timestamp_seconds{..., xid="CODE"}` is the unix time of the
newest XID of each code on each card. The exported `xid` rules are written over that one, so they
mean what gpumon's do: firing as soon as an XID is scraped, resolved once the card has been quiet
for the rule's quiet period. `DCGM_EXP_XID_ERRORS_COUNT{..., window_size_in_ms, xid}` is
dcgm-exporter's count of the XIDs of each code within the last 5 minutes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from gpumon.errors import UsageError
from gpumon.exporter.amd import DRM_FIELDS
from gpumon.exporter.fields import CARD_FIELDS, LOST, XID_COUNT_WINDOW_S
from gpumon.exporter.health import HEALTH, HEALTH_FIELDS, HEALTH_HELP, health_value
from gpumon.exporter.owners import OWNER_LABELS, card_labels, process_labels
from gpumon.exporter.sharing import sharing_families
from gpumon.exporter.vendors import vendor_families
from gpumon.model import Snapshot
from gpumon.sharing.folder import SharingSettings

# Every card's readings under one set of labels, in the exposition's order.
GAUGES = [f for f in CARD_FIELDS + HEALTH_FIELDS + DRM_FIELDS if f.exported]
# `vendor`: "nvidia", "amd", "intel": AMD and Intel cards are under the same names (their `device`
# is "amd4", "intel5" where NVIDIA's is "nvidia0"). Then who holds the card (prometheus_owners).
LABELS = ["gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "vendor", *OWNER_LABELS]
# dcgm-exporter's dcgmFabricManagerStatus_t: 1 not started, 2 in progress, 3 success, 4 failure.
FABRIC_STATUS = {"not_started": 1, "in_progress": 2, "ready": 3, "degraded": 3, "failed": 4}


@dataclass(frozen=True)
class Reading:
    """One host's cards for the exposition: its snapshot, the Hostname label, and the copies the
    event loop publishes (rules firing per card; (card, XID code) -> time of the newest, or None
    when XIDs are not followed there)."""

    host: str
    snapshot: Snapshot
    firing: dict[int, tuple[str, ...]] | None = None
    xids: dict[tuple[int, int], float] | None = None
    recent_xids: dict[tuple[int, int], tuple[float, ...]] | None = None  # the times of each within the window


class GpumonCollector(Collector):
    """Builds the metrics at scrape time from the newest snapshot: nothing is done per sample."""

    def __init__(self, latest: Callable[[], Snapshot | None],
                 firing: Callable[[], dict[int, tuple[str, ...]]] | None = None,
                 xid: Callable[[], dict[tuple[int, int], float]] | None = None, processes: bool = False,
                 hostname: str | None = None,
                 recent_xids: Callable[[], dict[tuple[int, int], tuple[float, ...]]] | None = None,
                 sharing: SharingSettings | None = None) -> None:
        """`xid`: (card index, XID code) -> unix time of the newest such XID; a copy the caller
        replaces whole (read from the scrape thread); `recent_xids` the same with the times of each
        within XID_COUNT_WINDOW_S. `hostname`: the Hostname label (default: the snapshot's host,
        this machine's name), which is how a Prometheus reader tells hosts apart. `sharing`: where
        this host's reservations are ([claims]; None: the defaults)."""
        self.latest = latest
        self.firing = firing
        self.xid = xid
        self.recent_xids = recent_xids
        self.processes = processes
        self.hostname = hostname
        self.sharing = sharing or SharingSettings()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.latest()
        if snap is None:
            return
        firing = self.firing() if self.firing is not None else None
        reading = Reading(self.hostname or snap.host, snap, firing, self.xid() if self.xid else {},
                          self.recent_xids() if self.recent_xids else {})
        yield from families([reading], self.processes, alerts=self.firing is not None)
        # This machine's reservations, and the processes on others' cards (exporter/sharing.py).
        yield from sharing_families(snap, reading.host, self.sharing)


class FleetCollector(Collector):
    """`watch --hosts --prometheus`: every host's cards, each with the fleet's name for its host as
    `Hostname`, and `gpumon_host_up{Hostname}` (1 while the host answers, 0 while it is away). A
    host that is away has no card series: its old values are not a reading."""

    def __init__(self, readings: Callable[[], tuple[list[Reading], dict[str, bool]]], processes: bool = False,
                 alerts: bool = False) -> None:
        """`readings`: the hosts that answer now, and every host's up (True) or away (False)."""
        self.readings = readings
        self.processes = processes
        self.alerts = alerts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        readings, up = self.readings()
        family = GaugeMetricFamily("gpumon_host_up", "1 while the host answers, 0 while it cannot be read.",
                                   labels=["Hostname"])
        for host, answers in up.items():
            family.add_metric([host], 1.0 if answers else 0.0)
        yield family
        yield from families(readings, self.processes, alerts=self.alerts, per_host=True)


def families(readings: list[Reading], processes: bool = False, alerts: bool = False,
             per_host: bool = False) -> Iterator[GaugeMetricFamily]:
    """The exposition of these hosts' cards. `per_host`: the series that are not about one card
    (sample age, rules firing) get a Hostname label too, as one exporter speaks for many hosts."""
    labels = {(r.host, g.index): [str(g.index), g.uuid or "", f"{g.vendor}{g.index}", g.name, r.host,
                                  g.pci_bus_id or "", g.vendor, *card_labels(g)]
              for r in readings for g in r.snapshot.gpus}
    cards = [(r, g, labels[r.host, g.index]) for r in readings for g in r.snapshot.gpus]
    for f in GAUGES:
        family = GaugeMetricFamily(f.name, f.help, labels=LABELS)
        for _, g, card in cards:  # a card that does not answer has no readings
            if g.state == "ok" and (value := f.value(g)) is not None:
                family.add_metric(card, float(value))
        yield family
    followed = [r for r in readings if r.xids is not None]  # a fleet host's XIDs are not followed
    if followed:
        family = GaugeMetricFamily("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.",
                                   labels=LABELS)
        seen = GaugeMetricFamily("gpumon_xid_last_timestamp_seconds", "Unix time of the newest XID error of this code.",
                                 labels=LABELS + ["xid"])
        for r in followed:
            newest: dict[int, tuple[float, int]] = {}
            for (index, code), when in r.xids.items():
                newest[index] = max(newest.get(index, (when, code)), (when, code))
            for g in r.snapshot.gpus:
                family.add_metric(labels[r.host, g.index], float(newest[g.index][1]) if g.index in newest else 0.0)
            for (index, code), when in sorted(r.xids.items()):
                if (r.host, index) in labels:
                    seen.add_metric(labels[r.host, index] + [str(code)], when)
        yield family
        yield seen
        yield _xid_counts(followed, labels, time.time())
    fabric = GaugeMetricFamily("DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
                               "NVSwitch fabric registration: 1 not started, 2 in progress, 3 success, 4 failure.",
                               labels=LABELS)
    for _, g, card in cards:
        if g.fabric in FABRIC_STATUS:
            fabric.add_metric(card, float(FABRIC_STATUS[g.fabric]))
    yield fabric
    verdicts = GaugeMetricFamily(HEALTH, HEALTH_HELP, labels=LABELS + ["reason"])
    for _, g, card in cards:  # a lost card's verdict too: it fails
        if (verdict := health_value(g)) is not None:
            verdicts.add_metric(card + [verdict[1]], verdict[0])
    yield verdicts
    lost = GaugeMetricFamily(LOST.name, LOST.help, labels=LABELS)
    for _, g, card in cards:
        lost.add_metric(card, LOST.value(g))  # type: ignore[arg-type]
    yield lost
    yield from vendor_families([(r.host, r.snapshot.gpus) for r in readings])
    host_label = ["Hostname"] if per_host else []
    stale = GaugeMetricFamily("gpumon_sample_age_seconds", "Seconds since the newest sample.", labels=host_label)
    now = time.time()
    for r in readings:
        stale.add_metric([r.host] if per_host else [], max(0.0, now - r.snapshot.time))
    yield stale
    if alerts:
        firing = GaugeMetricFamily("gpumon_alert_firing", "1 while a gpumon alert rule fires on a card.",
                                   labels=["rule", "gpu", *host_label])
        for r in readings:
            for gpu, rules in (r.firing or {}).items():
                for rule in rules:
                    firing.add_metric([rule, str(gpu), *([r.host] if per_host else [])], 1.0)
        yield firing
    if processes:
        procs = GaugeMetricFamily("gpumon_process_gpu_memory_bytes", "GPU memory used by a process.",
                                  labels=["gpu", "UUID", "Hostname", "pid", "user", "name", *OWNER_LABELS])
        for r, g, _ in cards:
            for p in g.processes:
                if p.gpu_memory is not None:
                    name = (p.command or "?").split(" ", 1)[0].rsplit("/", 1)[-1][:64]
                    procs.add_metric([str(g.index), g.uuid or "", r.host, str(p.pid), p.user or "?", name,
                                      *process_labels(p.owner)], float(p.gpu_memory))
        yield procs


def _xid_counts(readings: list[Reading], labels: dict[tuple[str, int], list[str]], now: float) -> GaugeMetricFamily:
    """dcgm-exporter's DCGM_EXP_XID_ERRORS_COUNT: the XIDs of each code on each card within the
    window (its --xid-count-window-size, 5 minutes by default), with the window in ms as a label."""
    window = [str(int(XID_COUNT_WINDOW_S * 1000))]
    counts = GaugeMetricFamily("DCGM_EXP_XID_ERRORS_COUNT",
                               "Count of XID Errors within user-specified time window (see xid-count-window-size "
                               "param).", labels=LABELS + ["window_size_in_ms", "xid"])
    for r in readings:
        for (index, code), times in sorted((r.recent_xids or {}).items()):
            n = sum(1 for t in times if now - t <= XID_COUNT_WINDOW_S)
            if n and (r.host, index) in labels:
                counts.add_metric(labels[r.host, index] + window + [str(code)], float(n))
    return counts


def registry_for(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def parse_listen_address(text: str) -> tuple[str, int]:
    """'9400' or ':9400' -> loopback; 'HOST:PORT' binds HOST (explicitly, e.g. 0.0.0.0:9400)."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"bad --prometheus address {text!r}: expected PORT or HOST:PORT") from None
    if not 0 < number < 65536:
        raise UsageError(f"bad --prometheus port {port}: must be 1-65535")
    return host, number

