"""How the cards connect: NVLinks (to another card, or to NVSwitches), the PCIe path between each
pair, CPU and NUMA affinity.

On HGX/DGX boards every NVLink of every card goes to an NVSwitch, never to another card; two
cards on the same switch fabric reach each other at full NVLink speed, and `nvidia-smi topo -m`
shows NV18 (H100) or NV12 (A100) for the pair. A link's remote end is told by
nvmlDeviceGetNvLinkRemoteDeviceType (or, on drivers without it, by a remote PCI id that is not one
of the cards), and nvmlDeviceGetP2PStatus(…, NVLINK) says whether a pair can talk over the fabric.

Each card's row is read on its own lane (`read_row`), so a card that does not answer leaves only
itself out; `assemble` makes the matrix of whatever rows have arrived, and `read_links` runs it
all against a deadline.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pynvml

from gpumon.cards.backends.lanes import Lanes
from gpumon.cards.backends.nvml.library import DRIVER_GONE, Card, DriverGone, decode
from gpumon.cards.backends.nvml.opening import open_card
from gpumon.model import Topology

# nvidia-smi's topology legend for nvmlDeviceGetTopologyCommonAncestor levels.
TOPOLOGY_LEGEND = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
_GPU = getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
_SWITCH = getattr(pynvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
_P2P_NVLINK = getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)


@dataclass
class Row:
    """What one card knows about its links."""

    peer_buses: list[str] = field(default_factory=list)  # remote PCI ids of its card-to-card NVLinks
    switch_links: int = 0  # NVLinks whose remote end is an NVSwitch (or anything but a card)
    levels: dict[int, str | None] = field(default_factory=dict)  # other index -> PCIe path
    nvlink_p2p: dict[int, bool | None] = field(default_factory=dict)  # other index -> P2P over NVLink


def read_row(card: Card, others: list[Card]) -> Row:
    """Runs on `card`'s lane; `others` are the cards that answer (asking a hung card would hang)."""
    row = Row()
    buses = {c.pci_bus_id.lower() for c in others if c.pci_bus_id}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if not pynvml.nvmlDeviceGetNvLinkState(card.handle, link):
                continue
            bus = decode(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(card.handle, link).busId)
        except pynvml.NVMLError as exc:
            _raise_if_gone(exc)
            break  # NOT_SUPPORTED: no NVLink; INVALID_ARGUMENT: past the card's last link
        kind = _remote_type(card, link)
        if kind == _GPU or (kind is None and bus.lower() in buses):
            row.peer_buses.append(bus)
        else:
            row.switch_links += 1
    for other in others:
        if other is card:
            continue
        row.levels[other.index] = _common_ancestor(card, other)
        if row.switch_links:
            row.nvlink_p2p[other.index] = _p2p_over_nvlink(card, other)
    return row


def _remote_type(card: Card, link: int) -> int | None:
    """GPU or SWITCH; None when the driver (or the bindings) cannot say."""
    if "nvlink_remote_type" in card.skip or not hasattr(pynvml, "nvmlDeviceGetNvLinkRemoteDeviceType"):
        return None
    try:
        return pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(card.handle, link)
    except pynvml.NVMLError as exc:
        _raise_if_gone(exc)
        card.skip.add("nvlink_remote_type")
        return None


def _p2p_over_nvlink(a: Card, b: Card) -> bool | None:
    try:
        return pynvml.nvmlDeviceGetP2PStatus(a.handle, b.handle, _P2P_NVLINK) == pynvml.NVML_P2P_STATUS_OK
    except pynvml.NVMLError as exc:
        _raise_if_gone(exc)
        return None


def _common_ancestor(a: Card, b: Card) -> str | None:
    try:
        level = pynvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)
    except pynvml.NVMLError as exc:
        _raise_if_gone(exc)
        return None
    return TOPOLOGY_LEGEND.get(level)


def _raise_if_gone(exc: pynvml.NVMLError) -> None:
    if exc.value in DRIVER_GONE:
        raise DriverGone(str(exc)) from None


def assemble(cards: list[Card], rows: dict[int, Row], left_out: list[tuple[int, str]]) -> Topology:
    """The matrix of the cards in `cards`; a pair whose rows have not arrived reads None."""
    nvlinks = [[0] * len(cards) for _ in cards]
    links: list[list[str | None]] = []
    for i, a in enumerate(cards):
        row: list[str | None] = []
        for j, b in enumerate(cards):
            if i == j:
                row.append("X")
                continue
            nvlinks[i][j] = count = _nvlinks_between(a, b, rows)
            if count:
                row.append(f"NV{count}")
            else:
                ra, rb = rows.get(a.index), rows.get(b.index)
                row.append((ra.levels.get(b.index) if ra else None) or (rb.levels.get(a.index) if rb else None))
        links.append(row)
    return Topology(
        indices=tuple(c.index for c in cards),
        links=tuple(tuple(r) for r in links),
        nvlinks=tuple(tuple(r) for r in nvlinks),
        cpu_affinity=tuple(c.cpu_affinity for c in cards),
        numa_node=tuple(c.numa_node for c in cards),
        left_out=tuple(sorted(left_out)),
        nvswitch=tuple(bool(rows.get(c.index) and rows[c.index].switch_links) for c in cards),
    )


def _nvlinks_between(a: Card, b: Card, rows: dict[int, Row]) -> int:
    ra, rb = rows.get(a.index), rows.get(b.index)
    direct = max(
        sum(1 for bus in ra.peer_buses if b.pci_bus_id and bus.lower() == b.pci_bus_id.lower()) if ra else 0,
        sum(1 for bus in rb.peer_buses if a.pci_bus_id and bus.lower() == a.pci_bus_id.lower()) if rb else 0,
    )
    if direct or not (ra and rb and ra.switch_links and rb.switch_links):
        return direct
    # Both wired to NVSwitches: linked through the fabric unless the driver says the pair cannot
    # talk over NVLink (another NVLink domain, a fabric partition).
    if ra.nvlink_p2p.get(b.index) is False or rb.nvlink_p2p.get(a.index) is False:
        return 0
    return min(ra.switch_links, rb.switch_links)


def _identified(card: Card) -> bool:
    return card.handle is not None and card.uuid is not None and card.state != "lost"


def _open_if_needed(card: Card) -> None:
    if not card.opened:
        open_card(card)


def read_links(cards: list[Card], lanes: Lanes, deadline: float,
               on_progress: Callable[[Topology], None] | None = None) -> Topology:
    """Each card's row on its lane: at once for cards already identified, after opening for the
    others; whatever has not answered by `deadline` is left out as "not responding"."""
    known = [c for c in cards if _identified(c)]
    rows: dict[int, Row] = {}
    left_out: list[tuple[int, str]] = []
    pending: dict[concurrent.futures.Future[Any], tuple[str, Card]] = {
        lanes.submit(c.index, partial(read_row, c, list(known))): ("row", c) for c in known}
    pending.update({lanes.submit(c.index, partial(_open_if_needed, c)): ("open", c)
                    for c in cards if not _identified(c)})
    while pending:
        done, _ = concurrent.futures.wait(pending, timeout=max(0.0, deadline - time.monotonic()),
                                          return_when=concurrent.futures.FIRST_COMPLETED)
        if not done:
            break
        for future in done:
            kind, card = pending.pop(future)
            error = future.exception()
            if error is not None:
                left_out.append((card.index, f"could not be read: {error}"))
            elif kind == "open" and _identified(card):
                known.append(card)  # opened late: its row pairs it with every card known so far
                pending[lanes.submit(card.index, partial(read_row, card, list(known)))] = ("row", card)
            elif kind == "open":
                left_out.append((card.index, card.error or card.state))
            else:
                rows[card.index] = future.result()
        if on_progress is not None and rows:
            on_progress(assemble(_in_order(known, cards), rows, left_out))
    left_out += [(card.index, "not responding") for card in (c for _, c in pending.values())]
    return assemble(_in_order([c for c in known if c.index in rows], cards), rows, left_out)


def _in_order(some: list[Card], cards: list[Card]) -> list[Card]:
    return [c for c in cards if c in some]
