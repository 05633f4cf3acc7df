"""AMD (amdgpu) and Intel (i915, xe) cards, read from sysfs and /proc/PID/fdinfo: no library.

Each card's files are read on a lane of its own (`backends/lanes.py`, as NVML's calls are): a read
the kernel never finishes (a card in a bad state, a hung SMU) holds up only that card, which is
shown "stale" with its last values after STALE_AFTER_S and answers again when the read returns.
The processes' use (/proc/PID/fdinfo) is read in the sampler's thread, per process, not per card.
Each sample reads a card's runtime PM status first: a card the kernel has put to sleep is shown
asleep and nothing else of it is read (reading its sensors would wake it, and keep it awake).
A card whose sysfs entry goes away (unplugged, unbound) stays in the list as "lost"; the list is
looked at again every DISCOVER_S for cards that come back or arrive (new ones get the next index).

Values the kernel does not give are None: an Intel card's memory in use, an AMD card's encoder
load. An Intel card's utilisation has no sysfs file: it is the busiest compute engine's time,
added up over the DRM clients gpumon can read (every client when run as root).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from typing import Any

from gpumon.cards.backends.base import Machine, PerCardBackend
from gpumon.cards.backends.drm import amdgpu, intel, ras
from gpumon.cards.backends.drm.fdinfo import COMPUTE_ENGINES, ClientUse, DrmClients
from gpumon.cards.backends.drm.hwmon import Hwmon, find_hwmon
from gpumon.cards.backends.drm.kinds import BY_VENDOR, no_cards
from gpumon.cards.backends.drm.names import PCI_IDS, card_name
from gpumon.cards.backends.drm.sysfs import CardNode, find_cards, link_speed, link_width, runtime_status
from gpumon.cards.backends.drm.topology import link_matrix
from gpumon.cards.backends.lanes import STALE_AFTER_S, Lanes, not_responding, settle
from gpumon.cards.backends.pci import pci_path
from gpumon.errors import NoDriverError
from gpumon.health.rules import HealthSettings
from gpumon.model import GpuSample, ProcessSample, Snapshot, Topology

log = logging.getLogger(__name__)
DISCOVER_S = 5.0
ASLEEP = ("suspended", "suspending")
XGMI_ASLEEP = "asleep: its xGMI links are not known (reading them would wake it)"
DEFAULT_WAIT_S = 2.0  # how long sample() and topology() wait for slow cards when the caller does not say
STAGGER_S = 0.02  # cards are read one after another (no contention for the GIL) unless one is slow


@dataclass(slots=True)
class _Card:
    node: CardNode
    index: int
    vendor_index: int | None = None  # its number among its vendor's cards (ROCm, Level Zero)
    present: bool = True
    identity: amdgpu.AmdIdentity | None = None  # AMD: read once the card is awake
    hwmon: Hwmon | None = None
    hwmon_found: bool = False
    energy: tuple[float, int] | None = None  # (when, µJ): the last reading of the energy counter
    pending: Future[GpuSample] | None = None  # the read on its lane, until its answer is taken
    last: GpuSample | None = None  # its last answer
    asked_at: float = 0.0
    answered_at: float | None = None


class DrmBackend(PerCardBackend):
    name = "drm"

    def __init__(self, sysfs: str = "/sys", procfs: str = "/proc", first_index: int = 0,
                 pci_ids: tuple[str, ...] = PCI_IDS, clock: Callable[[], float] = time.monotonic,
                 health: HealthSettings = HealthSettings()) -> None:
        self.sysfs, self.procfs = sysfs, procfs
        self.first_index = first_index
        self.pci_ids = pci_ids
        self.clock = clock
        self.host = socket.gethostname()
        self.cards: list[_Card] = []
        self.clients = DrmClients(procfs=procfs, sysfs=sysfs, clock=clock)
        self.ras = ras.RasHealth(clock, health)  # each card's health counters and verdict
        self._lanes = Lanes("gpumon-drm-card")
        self._processes: dict[str, tuple[ProcessSample, ...]] = {}  # this sample's, by PCI address
        self._discover_at = 0.0
        self._discover()

    @classmethod
    def open_here(cls, machine: Machine, first_index: int = 0) -> DrmBackend:
        backend = cls(sysfs=machine.sysfs, procfs=machine.procfs, first_index=first_index, health=machine.health)
        if not backend.cards:
            raise NoDriverError(no_cards(backend.sysfs))
        return backend

    def index_count(self) -> int:
        return len(self.cards)

    def pci_paths(self, sysfs: str) -> dict[int, Sequence[str]]:
        return {c.index: pci_path(c.node.device) for c in self.cards if c.present}

    def _discover(self) -> None:
        """Cards that arrived or came back; vendor numbers as ROCm and Level Zero count them."""
        self._discover_at = self.clock() + DISCOVER_S
        known = {card.node.pci_address: card for card in self.cards}
        for node in find_cards(self.sysfs):
            card = known.get(node.pci_address)
            if card is None:
                self.cards.append(_Card(node, self.first_index + len(self.cards)))
            elif not card.present or card.node != node:  # back (maybe as another cardN)
                card.node, card.present, card.hwmon_found, card.energy = node, True, False, None
        # ROCm numbers AMD cards as KFD's topology lists them, which is PCI bus order; Level
        # Zero, with ZE_ENABLE_PCI_ID_DEVICE_ORDER=1 (set with ZE_AFFINITY_MASK), PCI order too.
        present = sorted((c for c in self.cards if c.present), key=lambda c: c.node.pci_address)
        numbers: dict[str, int] = {}
        for card in present:
            card.vendor_index = numbers.get(card.node.vendor, 0)
            numbers[card.node.vendor] = card.vendor_index + 1

    def sample(self, wait_s: float | None = None) -> Snapshot:
        """Every card, waiting up to `wait_s` (default DEFAULT_WAIT_S) for cards still answering."""
        deadline = time.monotonic() + (DEFAULT_WAIT_S if wait_s is None else wait_s)
        self.ask(deadline)
        return self.collect(deadline)

    def ask(self, deadline: float) -> None:
        """Start a sample: the processes' use (here), and each card's files (on its lane). A card
        still busy with the last question is not asked again."""
        for card in self.cards:
            if card.present and not os.path.isdir(card.node.device):
                card.present = False
        if self.clock() >= self._discover_at:
            self._discover()
        uses: dict[str, list[ClientUse]] = {}
        for use in self.clients.read():
            uses.setdefault(use.pci_address, []).append(use)
        self._processes = {address: _processes(mine) for address, mine in uses.items()}
        for card in self.cards:
            if card.present and card.pending is None:
                address = card.node.pci_address
                card.asked_at = time.monotonic()
                card.pending = self._lanes.submit(card.index, partial(
                    self._read_card, card, uses.get(address, []), self._processes.get(address, ())))
                settle(card.pending, min(STAGGER_S, deadline - time.monotonic()))

    def collect(self, deadline: float) -> Snapshot:
        """The cards as they stand at `deadline` (or sooner, once all have answered)."""
        for card in self.cards:
            if card.pending is not None:
                settle(card.pending, deadline - time.monotonic())
        return Snapshot(time=time.time(), host=self.host, backend=self.name, driver_version=None,
                        cuda_driver_version=None, gpus=tuple(self._answer(card) for card in self.cards))

    def _answer(self, card: _Card) -> GpuSample:
        """The card as it stands now: its new answer, its recent one, or its last one marked stale."""
        if not card.present:
            return self.ras.judge(card.node, GpuSample(
                **self._identity(card), state="lost",
                error=f"gone from {self.sysfs}/class/drm (unplugged, or its driver unbound)"))
        now = time.monotonic()
        future = card.pending
        if future is not None and future.done():
            card.pending, card.last, card.answered_at = None, future.result(), now
            return card.last
        since = card.answered_at if card.answered_at is not None else card.asked_at
        if card.last is not None and now - since < STALE_AFTER_S:
            return card.last  # a little late: nothing to report yet
        stale_s = round(now - since, 1)
        # fdinfo is not the card's: its processes are this sample's.
        processes = self._processes.get(card.node.pci_address, ())
        if card.last is None:
            return GpuSample(**self._identity(card), state="stale", stale_s=stale_s, error=not_responding(stale_s),
                             processes=processes)
        return dataclasses.replace(card.last, state="stale", stale_s=stale_s, error=not_responding(stale_s),
                                   processes=processes)

    def identity(self, wait_s: float = 0.0) -> Snapshot:
        """The cards' names and ids without values, for a first frame."""
        return Snapshot(time=time.time(), host=self.host, backend=self.name, driver_version=None,
                        cuda_driver_version=None, gpus=tuple(GpuSample(**self._identity(c)) for c in self.cards))

    def _identity(self, card: _Card) -> dict[str, Any]:
        node, ident = card.node, card.identity
        return dict(index=card.index, uuid=ident.uuid if ident else None,
                    name=card_name(node.vendor, node.pci_id, ident.product_name if ident else None, self.pci_ids),
                    pci_bus_id=node.pci_bus_id, vendor=node.vendor, numa_node=node.numa_node,
                    cpu_affinity=node.local_cpus, vendor_index=card.vendor_index,
                    vbios=ident.vbios if ident else None, serial=ident.serial if ident else None)

    def _read_card(self, card: _Card, uses: list[ClientUse], processes: tuple[ProcessSample, ...]) -> GpuSample:
        """One card's sample with its health (RAS files are sysfs reads too); runs on its lane."""
        return self.ras.judge(card.node, self._read_values(card, uses, processes))

    def _read_values(self, card: _Card, uses: list[ClientUse], processes: tuple[ProcessSample, ...]) -> GpuSample:
        try:
            if runtime_status(card.node) in ASLEEP:
                return GpuSample(**self._identity(card), asleep=True, processes=processes)
            kind = BY_VENDOR[card.node.vendor]
            if kind.identity and card.identity is None:
                card.identity = amdgpu.read_identity(card.node.device)
            if not card.hwmon_found:
                card.hwmon, card.hwmon_found = find_hwmon(card.node.device), True
            values = READERS[kind.values](self, card, uses)
        except Exception as exc:  # a bug, or a file answering nonsense: this card only
            log.warning("%s: %s", card.node.name, exc, exc_info=True)
            return GpuSample(**self._identity(card), state="error", error=f"{type(exc).__name__}: {exc}",
                             processes=processes)
        device = card.node.device
        return GpuSample(**self._identity(card), asleep=False, processes=processes,
                         pcie_link_speed=link_speed(os.path.join(device, "current_link_speed")),
                         pcie_link_width=link_width(os.path.join(device, "current_link_width")),
                         pcie_link_speed_max=link_speed(os.path.join(device, "max_link_speed")),
                         pcie_link_width_max=link_width(os.path.join(device, "max_link_width")), **values)

    def _amd(self, card: _Card, uses: list[ClientUse]) -> dict[str, Any]:
        v = amdgpu.read_values(card.node.device, card.hwmon)
        free = v.vram_total - v.vram_used if v.vram_total is not None and v.vram_used is not None else None
        return dict(utilization_gpu=v.busy_percent, utilization_memory=v.memory_busy_percent,
                    memory_total=v.vram_total, memory_used=v.vram_used, memory_free=free,
                    gtt_total=v.gtt_total, gtt_used=v.gtt_used, temperature=v.temperature,
                    temperature_junction=v.temperature_junction, temperature_memory=v.temperature_memory,
                    fan=v.fan_percent, power_draw=_watts(v.power_w), power_limit=_watts(v.power_cap_w),
                    clock_sm=v.sclk_mhz, clock_mem=v.mclk_mhz, perf_level=v.perf_level)

    def _intel(self, card: _Card, uses: list[ClientUse]) -> dict[str, Any]:
        v = intel.read_values(card.node, card.hwmon)
        power = None
        if v.energy_uj is not None:
            now = self.clock()
            if card.energy is not None and now > card.energy[0] and v.energy_uj >= card.energy[1]:
                power = _watts((v.energy_uj - card.energy[1]) / 1e6 / (now - card.energy[0]))
            card.energy = (now, v.energy_uj)
        used = v.vram_total - v.vram_free if v.vram_total is not None and v.vram_free is not None else None
        return dict(utilization_gpu=_engine_load(uses), memory_total=v.vram_total, memory_used=used,
                    memory_free=v.vram_free if used is not None else None, temperature=v.temperature,
                    temperature_memory=v.temperature_memory, fan=v.fan_percent, power_draw=power,
                    power_limit=_watts(v.power_cap_w), clock_sm=v.clock_mhz)

    def topology(self, wait_s: float | None = None,
                 on_progress: Callable[[Topology], None] | None = None) -> Topology:
        """The PCIe paths and xGMI hives of the cards; a card whose lane has not read its identity
        (its hive) within `wait_s` is left out as "not responding"."""
        deadline = time.monotonic() + (DEFAULT_WAIT_S if wait_s is None else wait_s)
        reading = {card.index: self._lanes.submit(card.index, partial(self._read_identity, card))
                   for card in self.cards if card.present and BY_VENDOR[card.node.vendor].identity
                   and card.identity is None}
        for future in reading.values():
            settle(future, deadline - time.monotonic())
        hung = {index for index, future in reading.items() if not future.done()}
        asleep = {index for index, future in reading.items() if future.done() and not future.exception()
                  and future.result()}
        present = [c for c in self.cards if c.present and c.index not in hung]
        return link_matrix(
            [c.index for c in present], [pci_path(c.node.device) for c in present],
            [c.node.numa_node for c in present], [c.node.local_cpus for c in present],
            [c.identity.xgmi_hive if c.identity else None for c in present],
            left_out=sorted([(c.index, "gone from sysfs") for c in self.cards if not c.present]
                            + [(index, "not responding") for index in hung]),
            # amdgpu links a card into its hive's directory only when it is in one: a directory
            # entry, which the card need not be awake for (its hive id is the card's to say).
            unknown=[(c.index, XGMI_ASLEEP) for c in present if c.index in asleep
                     and os.path.isdir(os.path.join(c.node.device, "xgmi_hive_info"))])

    def _read_identity(self, card: _Card) -> bool:
        """On the card's lane: its identity (xGMI hive), once it is awake. True: it sleeps, unread."""
        if card.identity is None and runtime_status(card.node) in ASLEEP:
            return True
        if card.identity is None:
            card.identity = amdgpu.read_identity(card.node.device)
        return False

    def close(self) -> None:
        pass


# A DRM kind's `values` -> how its cards' values are read (drm/kinds.py).
READERS: dict[str, Callable[[DrmBackend, _Card, list[ClientUse]], dict[str, Any]]] = {
    "amdgpu": DrmBackend._amd, "intel": DrmBackend._intel}
BACKEND = DrmBackend


def _watts(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _engine_load(uses: list[ClientUse]) -> int | None:
    """The card's busiest compute engine, % of its time, from its clients' shares. None until two
    samples have been taken (busy time is a difference)."""
    measured = [use.busy for use in uses if use.busy is not None]
    if not measured and any(use.busy is None for use in uses):
        return None
    engines: dict[str, float] = {}
    for busy in measured:
        for engine, percent in busy.items():
            if engine in COMPUTE_ENGINES:
                engines[engine] = engines.get(engine, 0.0) + percent
    return round(min(100.0, max(engines.values(), default=0.0)))


def _processes(uses: list[ClientUse]) -> tuple[ProcessSample, ...]:
    """One entry per process on the card: its clients' VRAM added up, and its busiest compute
    engine (each engine's share added up over its clients)."""
    by_pid: dict[int, list[ClientUse]] = {}
    for use in uses:
        by_pid.setdefault(use.pid, []).append(use)
    out = []
    for pid, mine in by_pid.items():
        sizes = [u.vram for u in mine if u.vram is not None]
        engines: dict[str, float] = {}
        for use in mine:
            for engine, percent in (use.busy or {}).items():
                if engine in COMPUTE_ENGINES:
                    engines[engine] = engines.get(engine, 0.0) + percent
        measured = any(use.busy is not None for use in mine)
        out.append(ProcessSample(
            pid=pid, type="graphics" if any(u.primary for u in mine) else "compute",
            gpu_memory=sum(sizes) if sizes else None,
            sm_util=round(min(100.0, max(engines.values(), default=0.0))) if measured else None))
    return tuple(out)
