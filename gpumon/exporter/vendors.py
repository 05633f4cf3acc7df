"""The families a vendor's own exporter names its cards by, keyed by its record's `exporter`
(gpumon/vendors.py): every card is under dcgm-exporter's names too (exporter/fields.py), and a vendor
whose exporter people query by other names adds its writer here (AMD: device-metrics-exporter's,
exporter/amd.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily

from gpumon.exporter.amd import amd_families
from gpumon.model import GpuSample
from gpumon.vendors import vendor

Hosts = list[tuple[str, list[GpuSample]]]  # (Hostname, cards) of each host
VENDOR_FAMILIES: dict[str, Callable[[Hosts], Iterator[GaugeMetricFamily]]] = {
    "amd": amd_families,
}


def vendor_families(hosts: Hosts) -> Iterator[GaugeMetricFamily]:
    """Each vendor's families for its cards of these hosts; nothing for a vendor without cards here."""
    for key, families in VENDOR_FAMILIES.items():
        yield from families([(host, [g for g in gpus if vendor(g.vendor).exporter == key]) for host, gpus in hosts])
