"""Prometheus: the exposition `watch --prometheus` serves, and alert rules exported as a Prometheus
alerting-rules file.

Metric names follow dcgm-exporter 3.x (the `DCGM_FI_DEV_*` fields of its default counters file,
framebuffer sizes in MiB) with its labels `gpu`, `UUID`, `device`, `modelName`, `Hostname`,
`pci_bus_id`, so dashboards and rules written for dcgm-exporter work unchanged, and its `hpc_job`,
`pod`, `namespace`, `container` for who holds the card (prometheus_owners) on every reading of a
card and every process. gpumon's own metrics are prefixed `gpumon_`.

XIDs are events: `DCGM_FI_DEV_XID_ERRORS` keeps dcgm-exporter's meaning (the last XID's code, for
dashboards), and `gpumon_xid_last_timestamp_seconds{..., xid="CODE"}` is the unix time of the
newest XID of each code on each card. The exported `xid` rules are written over that one, so they
mean what gpumon's do: firing as soon as an XID is scraped, resolved once the card has been quiet
for the rule's quiet period.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from gpumon.alerting.prometheus_amd import DRM_GAUGES, amd_families
from gpumon.alerting.prometheus_health import HEALTH, HEALTH_GAUGES, HEALTH_HELP, health_rule_expr, health_value
from gpumon.alerting.prometheus_owners import OWNER_LABELS, card_labels, process_labels
from gpumon.alerting.rules import AlertEngine, Rule
from gpumon.errors import UsageError
from gpumon.model import THROTTLE_REASONS, GpuSample, Snapshot

MIB = 1 << 20
log = logging.getLogger(__name__)
THROTTLE_BITS = {name: bit for bit, name in THROTTLE_REASONS.items()}


def _reserved_mib(g: GpuSample) -> float | None:
    """What the driver keeps for itself: with used and free, a reader adds up the card's total."""
    if g.memory_total is None or g.memory_used is None or g.memory_free is None:
        return None
    return max(0, g.memory_total - g.memory_used - g.memory_free) / MIB


# (metric name, help, value from a card); framebuffer in MiB like dcgm-exporter.
GAUGES: list[tuple[str, str, Callable[[GpuSample], float | None]]] = [
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilization_gpu),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.utilization_memory),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).",
     lambda g: None if g.memory_used is None else g.memory_used / MIB),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).",
     lambda g: None if g.memory_free is None else g.memory_free / MIB),
    ("DCGM_FI_DEV_FB_RESERVED", "Framebuffer memory reserved (in MiB).", lambda g: _reserved_mib(g)),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature),
    ("DCGM_FI_DEV_FAN_SPEED", "Fan speed (in %).", lambda g: g.fan),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_draw),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "Power management limit (in W).", lambda g: g.power_limit),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.clock_sm),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", lambda g: g.clock_mem),
    ("DCGM_FI_DEV_ENC_UTIL", "Encoder utilization (in %).", lambda g: g.encoder_util),
    ("DCGM_FI_DEV_DEC_UTIL", "Decoder utilization (in %).", lambda g: g.decoder_util),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of uncorrectable (double-bit) volatile ECC errors.",
     lambda g: g.ecc_errors_uncorrected),
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "PCIe TX throughput (in KB/s).",
     lambda g: None if g.pcie_tx is None else g.pcie_tx / 1024),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "PCIe RX throughput (in KB/s).",
     lambda g: None if g.pcie_rx is None else g.pcie_rx / 1024),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (bitmask).",
     lambda g: None if g.throttle_reasons is None else float(sum(THROTTLE_BITS[r] for r in g.throttle_reasons))),
    ("gpumon_gpu_processes", "Processes using the GPU.", lambda g: None if g.state != "ok" else len(g.processes)),
]
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


class GpumonCollector(Collector):
    """Builds the metrics at scrape time from the newest snapshot: nothing is done per sample."""

    def __init__(self, latest: Callable[[], Snapshot | None], engine: AlertEngine | None = None,
                 xid: Callable[[], dict[tuple[int, int], float]] | None = None, processes: bool = False,
                 hostname: str | None = None) -> None:
        """`xid`: (card index, XID code) -> unix time of the newest such XID; a copy the caller
        replaces whole (read from the scrape thread). `hostname`: the Hostname label (default: the
        snapshot's host, this machine's name), which is how a Prometheus reader tells hosts apart."""
        self.latest = latest
        self.engine = engine
        self.xid = xid
        self.processes = processes
        self.hostname = hostname

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snap = self.latest()
        if snap is None:
            return
        firing = self.engine.firing() if self.engine is not None else None
        reading = Reading(self.hostname or snap.host, snap, firing, self.xid() if self.xid else {})
        yield from families([reading], self.processes, alerts=self.engine is not None)


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
    for name, doc, read in GAUGES + HEALTH_GAUGES + DRM_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=LABELS)
        for _, g, card in cards:
            value = read(g) if g.state == "ok" or name == "gpumon_gpu_processes" else None
            if value is not None:
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
    lost = GaugeMetricFamily("gpumon_gpu_lost", "1 when the card has fallen off the bus.", labels=LABELS)
    for _, g, card in cards:
        lost.add_metric(card, 1.0 if g.state == "lost" else 0.0)
    yield lost
    yield from amd_families([(r.host, r.snapshot.gpus) for r in readings])
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


def registry_for(collector: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


# -- Prometheus alerting rules --

# gpumon's mem is used / total. dcgm-exporter has no total: it is used + free + reserved (FB_RESERVED,
# which older dcgm-exporters lack: 0 then, by `or` with free * 0 of the same card).
_PROMQL: dict[str, str] = {
    "util": "DCGM_FI_DEV_GPU_UTIL{sel}",
    "mem": "(DCGM_FI_DEV_FB_USED{sel} / (DCGM_FI_DEV_FB_USED{sel} + DCGM_FI_DEV_FB_FREE{sel}"
           " + (DCGM_FI_DEV_FB_RESERVED{sel} or DCGM_FI_DEV_FB_FREE{sel} * 0)) * 100)",
    "mem_used": "(DCGM_FI_DEV_FB_USED{sel} * 1048576)",
    "temp": "DCGM_FI_DEV_GPU_TEMP{sel}",
    "power": "DCGM_FI_DEV_POWER_USAGE{sel}",
    "fan": "DCGM_FI_DEV_FAN_SPEED{sel}",
    "clock_sm": "DCGM_FI_DEV_SM_CLOCK{sel}",
    "procs": "gpumon_gpu_processes{sel}",
    "ecc": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{sel}",
}
XID_CODES = range(1, 1000)


def _xid_expr(rule: Rule) -> str:
    """An XID of a matching code on the card within the quiet period: fires when one is scraped,
    resolves when the newest is older than the quiet period. One alert per card and code."""
    matchers = [] if rule.gpus is None else ['gpu=~"' + "|".join(str(i) for i in sorted(rule.gpus)) + '"']
    if rule.op == "==":
        matchers.append(f'xid="{rule.threshold:g}"')
    elif rule.op == "!=":
        if rule.threshold != 0:  # `xid` alone is "any XID": no matcher
            matchers.append(f'xid!="{rule.threshold:g}"')
    else:
        matchers.append(f'xid=~"{_codes_regex([c for c in XID_CODES if rule.holds(float(c))])}"')
    sel = "{" + ",".join(matchers) + "}" if matchers else ""
    return f"time() - gpumon_xid_last_timestamp_seconds{sel} < {rule.duration:g}"


def _digits(digits: list[int]) -> str:
    if len(digits) == 10:
        return "[0-9]"
    if len(digits) == 1:
        return str(digits[0])
    if digits == list(range(digits[0], digits[-1] + 1)):
        return f"[{digits[0]}-{digits[-1]}]"
    return "[" + "".join(map(str, digits)) + "]"


def _codes_regex(codes: list[int]) -> str:
    """A short regex for a set of XID codes (1..999), decade by decade: `xid > 100` is
    `10[1-9]|1[1-9][0-9]|[2-9][0-9][0-9]`, not 899 alternatives."""
    wanted = set(codes)
    parts: list[str] = []
    decades = {d: [c % 10 for c in range(d * 10, d * 10 + 10) if c in wanted] for d in range(100)}
    full = {d for d, digits in decades.items() if len(digits) == 10}
    done: set[int] = set()
    hundreds = [h for h in range(1, 10) if all(d in full for d in range(h * 10, h * 10 + 10))]
    if hundreds:
        parts.append(_digits(hundreds) + "[0-9][0-9]")
        done |= {d for h in hundreds for d in range(h * 10, h * 10 + 10)}
    for h in range(10):  # whole decades of one hundred: `1[1-9][0-9]`
        tens = [d % 10 for d in range(h * 10, h * 10 + 10) if d in full and d not in done and d]
        if tens:
            parts.append((str(h) if h else "") + _digits(tens) + "[0-9]")
            done |= {h * 10 + t for t in tens}
    for d, digits in decades.items():
        if digits and d not in done:
            parts.append((str(d) if d else "") + _digits(digits))
    return "|".join(parts) or "0"  # XID codes start at 1: "0" matches none


def rule_expr(rule: Rule) -> str:
    """The rule in PromQL, per card: who holds the card (the owner labels) is left out, so an alert
    is the card's, as gpumon's own are, and goes on firing when the job on the card changes (a job
    that a fatal XID or a lost card ends would otherwise resolve its alert and start another)."""
    return f"max without ({', '.join(OWNER_LABELS)}) ({_card_expr(rule)})"


def _card_expr(rule: Rule) -> str:
    sel = "" if rule.gpus is None else '{gpu=~"' + "|".join(str(i) for i in sorted(rule.gpus)) + '"}'
    if rule.metric == "xid":
        return _xid_expr(rule)
    if (health := health_rule_expr(rule, sel)) is not None:
        return health
    if rule.metric == "lost":
        return f"gpumon_gpu_lost{sel} == 1"
    if rule.metric == "fabric":  # exported only for cards on an NVSwitch fabric
        return f"DCGM_FI_DEV_FABRIC_MANAGER_STATUS{sel} != 3"
    if rule.metric == "throttle":
        bits = sorted(THROTTLE_BITS[r] for r in rule.reasons)
        tests = [f"floor(DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{sel} / {bit}) % 2 == 1" for bit in bits]
        return " or ".join(f"({t})" for t in tests) if len(tests) > 1 else tests[0]
    if rule.metric == "power" and rule.percent:
        value = f"(DCGM_FI_DEV_POWER_USAGE{sel} / DCGM_FI_DEV_POWER_MGMT_LIMIT{sel} * 100)"
    else:
        value = _PROMQL[rule.metric].format(sel=sel)
    return f"{value} {rule.op} {rule.threshold:g}"


def _alert_name(rule: Rule, index: int) -> str:
    words = "".join(part.capitalize() for part in rule.metric.split("_"))
    return f"Gpumon{words}{index + 1}"


# Rules that no exported series can express.
NOT_IN_PROMQL = {
    "idle": "who holds a card idle is known to gpumon watch alone (it follows each process's SM %)",
    "unreachable": "a host's reachability: alert on up == 0 of its scrape job",
}


def prometheus_rules(rules: list[Rule]) -> str:
    """An alerting-rules file (YAML) for the rules; JSON-quoted strings are valid YAML scalars."""
    lines = ["# Generated by `gpumon alerts export --prometheus-rules`.",
             "# Over dcgm-exporter 3.x metric names, as `gpumon watch --prometheus` exports them.",
             "groups:", "  - name: gpumon", "    rules:"]
    exported = 0
    for i, rule in enumerate(rules):
        if rule.metric in NOT_IN_PROMQL:
            lines.insert(2 + i - exported, f"# Left out: {json.dumps(rule.text)}: {NOT_IN_PROMQL[rule.metric]}")
            continue
        exported += 1
        lines += [
            f"      - alert: {_alert_name(rule, i)}",
            f"        expr: {json.dumps(rule_expr(rule))}",
        ]
        if rule.duration and rule.metric != "xid":  # an xid rule's duration is its quiet period, in expr
            lines.append(f"        for: {_duration(rule.duration)}")
        if rule.clear is not None:
            lines.append("        # gpumon's 'clear' hysteresis has no PromQL equivalent; rule kept without it")
        lines += [
            "        labels:",
            "          severity: warning",
            "        annotations:",
            f"          summary: {json.dumps(_summary(rule))}",
            f"          rule: {json.dumps(rule.text)}",
        ]
    if not exported:
        lines[-1] = "    rules: []"
    return "\n".join(lines) + "\n"


def _summary(rule: Rule) -> str:
    where = " on GPU {{ $labels.gpu }} ({{ $labels.modelName }})"
    what = ": XID {{ $labels.xid }}" if rule.metric == "xid" else (
        ": {{ $labels.reason }}" if rule.metric == "health" else "")
    return f"gpumon rule {rule.text!r}{where}{what}"


def _duration(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{int(seconds // 3600)}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{int(seconds // 60)}m"
    if seconds >= 1 and seconds == int(seconds):
        return f"{int(seconds)}s"
    return f"{int(seconds * 1000)}ms"


def exposition(collector: Collector) -> bytes:
    return generate_latest(registry_for(collector))


def serve(address: str, collector: Collector):
    """The exporter on ADDRESS (`--prometheus`), in a thread of its own; returns the server."""
    from prometheus_client import start_http_server

    host, port = parse_listen_address(address)
    try:
        server, _ = start_http_server(port, host, registry=registry_for(collector))
    except OSError as exc:
        raise UsageError(f"cannot serve Prometheus metrics on {host}:{port}: {exc.strerror or exc}") from None
    log.info("serving Prometheus metrics on http://%s:%d/metrics", host, port)
    return server


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

