"""`gpumon_gpu_reserved`: which of this host's cards someone reserved, and
`gpumon_process_without_claim`: which processes are on cards others claim or reserved
(gpumon/sharing), read from the shared place at scrape time (nothing per sample)."""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from gpumon.exporter.owners import OWNER_LABELS, card_labels
from gpumon.model import Snapshot
from gpumon.sharing.folder import SharingSettings
from gpumon.sharing.view import host_sharing, of, uses_without_claim

RESERVED = "gpumon_gpu_reserved"
RESERVED_HELP = ("1 while the card is reserved (gpumon reserve; user: who holds it), 0 when not; "
                 "until: the reservation's end, unix time.")


WITHOUT_CLAIM = "gpumon_process_without_claim"
WITHOUT_CLAIM_HELP = ("1 for each process on a card another user claims or reserved that is not that user's "
                      "(holder: whose claim or reservation; kind: claimed or reserved). Advisory: it is not stopped.")


def sharing_families(snapshot: Snapshot, hostname: str, sharing: SharingSettings) -> list[GaugeMetricFamily]:
    """Both families from one read of the place."""
    shares = host_sharing(sharing, snapshot).cards
    unclaimed = GaugeMetricFamily(WITHOUT_CLAIM, WITHOUT_CLAIM_HELP,
                                  labels=["gpu", "UUID", "Hostname", "pid", "user", "holder", "kind"])
    for use in uses_without_claim(snapshot, shares):
        unclaimed.add_metric([str(use.gpu), use.uuid or "", hostname, str(use.pid), use.user or "", use.holder,
                              "claimed" if use.kind == "claim" else "reserved"], 1.0)
    return [reserved_family(snapshot, hostname, shares), unclaimed]


def reserved_family(snapshot: Snapshot, hostname: str, shares: dict) -> GaugeMetricFamily:
    # Who holds the card now (the owners' labels), as on every card series: a reservation its
    # holder's job uses reads as that job's.
    family = GaugeMetricFamily(RESERVED, RESERVED_HELP,
                               labels=["gpu", "UUID", "Hostname", "user", "until", *OWNER_LABELS])
    for g in snapshot.gpus:
        r = of(g, shares).reservation
        family.add_metric([str(g.index), g.uuid or "", hostname, r.user if r else "", f"{r.until:.0f}" if r else "",
                           *card_labels(g)], 1.0 if r else 0.0)
    return family
