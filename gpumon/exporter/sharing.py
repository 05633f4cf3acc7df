"""`gpumon_gpu_reserved`: which of this host's cards someone reserved (gpumon/sharing), read
from the shared place at scrape time (nothing per sample)."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from gpumon.exporter.owners import OWNER_LABELS, card_labels
from gpumon.model import Snapshot
from gpumon.sharing.folder import SharingSettings
from gpumon.sharing.view import host_sharing, of

RESERVED = "gpumon_gpu_reserved"
RESERVED_HELP = ("1 while the card is reserved (gpumon reserve; user: who holds it), 0 when not; "
                 "until: the reservation's end, unix time.")


def reserved_family(snapshot: Snapshot, hostname: str, sharing: SharingSettings) -> GaugeMetricFamily:
    shares = host_sharing(sharing, snapshot).cards
    # Who holds the card now (the owners' labels), as on every card series: a reservation its
    # holder's job uses reads as that job's.
    family = GaugeMetricFamily(RESERVED, RESERVED_HELP,
                               labels=["gpu", "UUID", "Hostname", "user", "until", *OWNER_LABELS])
    for g in snapshot.gpus:
        r = of(g, shares).reservation
        family.add_metric([str(g.index), g.uuid or "", hostname, r.user if r else "", f"{r.until:.0f}" if r else "",
                           *card_labels(g)], 1.0 if r else 0.0)
    return family
