"""AMD cards under the names AMD's own exporter gives them, and what AMD and Intel cards tell that
dcgm-exporter has no name for.

AMD's ROCm Device Metrics Exporter (github.com/ROCm/device-metrics-exporter, its metrics list and
pkg/amdgpu/gpuagent) names a card's readings `gpu_gfx_activity`, `gpu_edge_temperature`, … with
sizes in MB (MiB: amd-smi divides bytes by 2^20) and PCIe speeds in GT/s, and labels every series
with `gpu_id` (the card's number in ROCm's order), `serial_number`, `card_model`, `hostname` and who
holds the card: `pod`, `namespace`, `container` (Kubernetes) and `job_id`, `job_user`,
`job_partition` (Slurm). Names are without a prefix: that is what the exporter serves without a
config file, and what the Grafana dashboards AMD ships query by default (their `g_metrics_prefix`
is empty; the Helm chart's config adds `amd_`, which a scrape's metric_relabel_configs can add here).
Only AMD cards get these names; they keep dcgm-exporter's names (with `vendor`) as well.

Labels AMD's exporter fills from its own agent that gpumon does not read (the partition labels,
`card_series`, `driver_version`) are left out rather than made up; `gpu_uuid` is ROCm's id
(`GPU-` + the card's unique_id), not the agent's own form.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily

from gpumon.exporter.fields import Field
from gpumon.exporter.owners import card_labels
from gpumon.model import GpuSample

MIB = 1 << 20
AMD_LABELS = ["gpu_id", "gpu_uuid", "serial_number", "card_model", "vbios_version", "hostname",
              "pod", "namespace", "container", "job_id", "job_user", "job_partition"]


def _mib(size: int | None) -> float | None:
    return None if size is None else size / MIB


def _gtt_free(g: GpuSample) -> float | None:
    if g.gtt_total is None or g.gtt_used is None:
        return None
    return max(0, g.gtt_total - g.gtt_used) / MIB


def _vram_free(g: GpuSample) -> float | None:
    if g.memory_free is not None:
        return g.memory_free / MIB
    if g.memory_total is None or g.memory_used is None:
        return None
    return max(0, g.memory_total - g.memory_used) / MIB


def _corrected(g: GpuSample) -> float | None:
    return None if g.counters is None else g.counters.ecc_errors_corrected


# (name, help as AMD's exporter words it, value from a card)
AMD_GAUGES: list[tuple[str, str, Callable[[GpuSample], float | None]]] = [
    ("gpu_gfx_activity", "Graphics engine usage in Percentage (0-100)", lambda g: g.utilization_gpu),
    ("gpu_umc_activity", "Memory engine usage in Percentage (0-100)", lambda g: g.utilization_memory),
    ("gpu_edge_temperature", "Current edge temperature in Celsius", lambda g: g.temperature),
    ("gpu_junction_temperature", "Current junction/hotspot temperature in Celsius", lambda g: g.temperature_junction),
    ("gpu_memory_temperature", "Current memory temperature in Celsius", lambda g: g.temperature_memory),
    ("gpu_power_usage", "GPU Power usage in Watts", lambda g: g.power_draw),
    ("gpu_total_vram", "Total VRAM memory of the GPU (in MB)", lambda g: _mib(g.memory_total)),
    ("gpu_used_vram", "Used VRAM memory of the GPU (in MB)", lambda g: _mib(g.memory_used)),
    ("gpu_free_vram", "Free VRAM memory of the GPU (in MB)", _vram_free),
    ("gpu_total_gtt", "Total graphics translation table memory of the GPU (in MB)", lambda g: _mib(g.gtt_total)),
    ("gpu_used_gtt", "Used graphics translation table memory of the GPU (in MB)", lambda g: _mib(g.gtt_used)),
    ("gpu_free_gtt", "Free graphics translation table memory of the GPU (in MB)", _gtt_free),
    ("pcie_speed", "Current PCIe speed in GT/s", lambda g: g.pcie_link_speed),
    ("pcie_max_speed", "Maximum PCIe speed in GT/s", lambda g: g.pcie_link_speed_max),
    ("gpu_ecc_uncorrect_total", "Total Uncorrectable error count", lambda g: g.ecc_errors_uncorrected),
    ("gpu_ecc_correct_total", "Total Correctable error count", _corrected),
]
# gpu_clock's clocks: AMD's exporter numbers the clocks its agent lists (clock_index), shader clocks
# first; gpumon reads one shader (SYSTEM: sclk) and one memory (MEMORY: mclk) clock.
CLOCKS: list[tuple[str, str, Callable[[GpuSample], int | None]]] = [
    ("0", "SYSTEM", lambda g: g.clock_sm), ("1", "MEMORY", lambda g: g.clock_mem)]

# What AMD and Intel cards tell and dcgm-exporter has no name for, under gpumon's names for every
# card that has the value (so one query covers a mixed fleet; AMD's names above are AMD's only).
# Written, not read back.
DRM_FIELDS: list[Field] = [
    Field("gpumon_gpu_junction_temperature_celsius", "Junction (hotspot) temperature (in C).",
          "temperature_junction", back=False),
    Field("gpumon_gpu_gtt_total_bytes", "System memory the card can map (AMD GTT), in bytes.", "gtt_total", back=False),
    Field("gpumon_gpu_gtt_used_bytes", "System memory the card has mapped (AMD GTT), in bytes.", "gtt_used",
          back=False),
    Field("gpumon_gpu_pcie_link_speed_gts", "PCIe link speed now (in GT/s).", "pcie_link_speed", back=False),
    Field("gpumon_gpu_pcie_link_speed_max_gts", "Fastest PCIe link speed of the card and its slot (in GT/s).",
          "pcie_link_speed_max", back=False),
    Field("gpumon_gpu_pcie_link_width", "PCIe lanes in use now.", "pcie_link_width", back=False),
    Field("gpumon_gpu_pcie_link_width_max", "Most PCIe lanes the card and its slot can use.", "pcie_link_width_max",
          back=False),
]


def _owners(g: GpuSample) -> list[str]:
    """pod, namespace, container, job_id, job_user, job_partition: the card's one holder (as
    prometheus_owners decides it); job_user the user running that Slurm job on the card. The
    partition is Slurm's to say, and gpumon does not ask it."""
    job, pod, namespace, container = card_labels(g)
    users = {p.owner.user for p in g.processes if p.owner is not None and p.owner.kind == "slurm"}
    user = users.pop() if job and len(users) == 1 else None
    return [pod, namespace, container, job, user or "", ""]


def _ids(gpus: list[GpuSample]) -> dict[int, str]:
    """gpu_id of each AMD card: its number in ROCm's order, as AMD's agent numbers them; where the
    sample has none (read back from JSON), its place among the AMD cards by PCI bus id, which is
    ROCm's order."""
    amd = sorted(gpus, key=lambda g: (g.pci_bus_id or "", g.index))
    return {g.index: str(g.vendor_index if g.vendor_index is not None else n) for n, g in enumerate(amd)}


def amd_families(hosts: list[tuple[str, list[GpuSample]]]) -> Iterator[GaugeMetricFamily]:
    """AMD's names for these hosts' AMD cards ((Hostname, its AMD cards) each; exporter/vendors.py
    picks them); nothing without one."""
    cards: list[tuple[GpuSample, list[str]]] = []
    nodes = GaugeMetricFamily("gpu_nodes_total", "Number of GPUs in the node", labels=["hostname"])
    for host, gpus in hosts:
        ids = _ids(gpus)
        if not ids:
            continue
        nodes.add_metric([host], float(len(ids)))
        cards += [(g, [ids[g.index], g.uuid or "", g.serial or "", g.name, g.vbios or "", host, *_owners(g)])
                  for g in gpus if g.index in ids]
    if not cards:
        return
    yield nodes
    for name, doc, read in AMD_GAUGES:
        family = GaugeMetricFamily(name, doc, labels=AMD_LABELS)
        for g, labels in cards:
            if g.state == "ok" and (value := read(g)) is not None:
                family.add_metric(labels, float(value))
        yield family
    clock = GaugeMetricFamily("gpu_clock", "List of current GPU clock frequencies in MHz",
                              labels=["clock_index", "clock_type", *AMD_LABELS])
    for g, labels in cards:
        for number, kind, read in CLOCKS:
            if g.state == "ok" and (value := read(g)) is not None:
                clock.add_metric([number, kind, *labels], float(value))
    yield clock
    health = GaugeMetricFamily("gpu_health", "Health of the GPU (0 = Unhealthy | 1 = Healthy)", labels=AMD_LABELS)
    for g, labels in cards:  # gpumon's verdict: a failing card (a lost one too) is unhealthy, a warning is not
        if g.health is not None:
            health.add_metric(labels, 0.0 if g.health.verdict == "fail" else 1.0)
    yield health
