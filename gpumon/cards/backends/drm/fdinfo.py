"""Processes on AMD and Intel cards, from /proc/PID/fdinfo (Documentation/gpu/drm-usage-stats.rst).

Each open DRM file of a process is a client of one card; its fdinfo says which (`drm-pdev`, the
PCI address, and `drm-client-id`), how much memory it holds per region (`drm-resident-vram: 512 KiB`;
amdgpu's older `drm-memory-vram`), and its engines' busy time, cumulative (`drm-engine-gfx: 123 ns`;
xe: `drm-cycles-rcs` out of `drm-total-cycles-rcs`). Busy % is the difference between two samples.

Several fds can be one client (dup, a child that inherited it): a client is counted once, keyed
by its card and `drm-client-id`, never by inode. DRM fds are told by their `fd/N` link — a path
ending in `/dev/dri/cardN` or `/dev/dri/renderDN`, under whatever root: a host's /proc mounted in
a container links to the host's paths — and by the `drm-driver` key in their fdinfo.

Cost: looking at every fd of every process each second is the expensive part (a readlink per
fd). So which fds of a pid are DRM ones is remembered, and a pid's fd list is read again only
every RESCAN_S (staggered, so not all at once); each sample reads only the fdinfo files of known
DRM fds, and an fd that is no longer a DRM file (closed, reused) has its pid's list read again at
once. A process that opens a card later is seen within RESCAN_S (2 x RESCAN_S at most). A pid
reused by another process needs no start time to be told apart: /proc/PID/fdinfo/N is always the
current holder's, and a client is known by its card and drm-client-id, never by its pid. Processes
vanish at any moment: ENOENT/ESRCH while reading are normal, and a process gpumon may not look
into (another user's, unless root) is left out. benchmarks/sampler_cost.py measures it.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gpumon.cards.backends.drm.sysfs import render_node_device

RESCAN_S = 5.0
_NODE = re.compile(r"/dev/dri/(card\d+|renderD\d+)$")
_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
# The engines that run a program's kernels and shaders (not copy, video or JPEG engines): a
# process's busy % is its busiest of these, like NVIDIA's SM utilisation.
COMPUTE_ENGINES = frozenset({"gfx", "compute", "render", "rcs", "ccs"})


@dataclass(frozen=True, slots=True)
class DrmClient:
    """One DRM client's fdinfo, as the kernel gives it."""

    driver: str
    pdev: str | None  # "0000:03:00.0"; None before drm-pdev existed
    client_id: int | None
    engine_ns: dict[str, int]  # engine -> busy ns so far
    cycles: dict[str, int]  # xe: engine -> busy GPU cycles so far ...
    total_cycles: dict[str, int]  # ... out of these
    capacity: dict[str, int]  # engine -> how many of it (busy % is of all of them)
    vram: int | None  # bytes of the card's own memory it holds (resident), None: not said


def _size(value: str) -> int | None:
    number, _, unit = value.partition(" ")
    try:
        return int(number) * _UNITS[unit.strip()]
    except (ValueError, KeyError):
        return None


def _vram_region(region: str) -> bool:
    """amdgpu's "vram", xe's "vram0", "vram1", i915's "local0": the card's own memory."""
    return region.startswith(("vram", "local"))


def parse_fdinfo(text: str) -> DrmClient | None:
    """A DRM client's usage, or None when the fdinfo is not a DRM client's (no drm-driver).
    One pass over the lines: this runs for every client, every sample."""
    if "drm-driver:" not in text:
        return None
    driver = pdev = client_id = None
    engines: dict[str, int] = {}
    cycles: dict[str, int] = {}
    totals: dict[str, int] = {}
    capacity: dict[str, int] = {}
    memory: dict[str, dict[str, int]] = {"resident": {}, "memory": {}, "total": {}}
    for line in text.split("\n"):
        if not line.startswith("drm-"):
            continue
        key, _, value = line[4:].partition(":")
        value = value.strip()
        try:
            if key.startswith("engine-"):
                if key.startswith("engine-capacity-"):
                    capacity[key[16:]] = max(1, int(value))
                else:
                    engines[key[7:]] = int(value.split(None, 1)[0])  # "123 ns"
            elif key.startswith("cycles-"):
                cycles[key[7:]] = int(value)
            elif key.startswith("total-cycles-"):
                totals[key[13:]] = int(value)
            elif key == "driver":
                driver = value
            elif key == "pdev":
                pdev = value.lower()
            elif key == "client-id":
                client_id = int(value)
            else:  # memory: drm-<kind>-<region>
                kind, _, region = key.partition("-")
                if kind in memory and _vram_region(region) and (size := _size(value)) is not None:
                    memory[kind][region] = size
        except (ValueError, IndexError):
            continue  # one odd line does not spoil the rest
    if not driver:
        return None
    # Resident is what sits in VRAM now (NVIDIA's "used"); older amdgpu says it as drm-memory-vram.
    vram = next((sum(m.values()) for m in (memory["resident"], memory["memory"], memory["total"]) if m), None)
    return DrmClient(driver=driver, pdev=pdev or None, client_id=client_id, engine_ns=engines, cycles=cycles,
                     total_cycles=totals, capacity=capacity, vram=vram)


def busy_percent(before: DrmClient, after: DrmClient, seconds: float) -> dict[str, float]:
    """Engine -> % busy between two readings of one client (of all of that engine's instances)."""
    busy: dict[str, float] = {}
    if seconds > 0:
        for engine, ns in after.engine_ns.items():
            if engine in before.engine_ns:
                busy[engine] = (ns - before.engine_ns[engine]) / (seconds * 1e9)
    for engine, count in after.cycles.items():
        total = after.total_cycles.get(engine, 0) - before.total_cycles.get(engine, 0)
        if engine in before.cycles and total > 0:
            busy[engine] = (count - before.cycles[engine]) / total
    return {engine: max(0.0, min(100.0, 100 * share / after.capacity.get(engine, 1)))
            for engine, share in busy.items()}


@dataclass(frozen=True, slots=True)
class ClientUse:
    """One client in one sample: whose, on which card, and how much."""

    pid: int
    pci_address: str
    vram: int | None
    busy: dict[str, float] | None  # engine -> %; None the first time a client is seen
    primary: bool  # through the card's primary node (/dev/dri/cardN): a display server, a compositor


@dataclass(slots=True)
class _Pid:
    fds: list[tuple[str, str]] = field(default_factory=list)  # (fd, node) of its DRM files
    rescan_at: float = 0.0


def _read(path: str) -> bytes | None:
    """A small /proc file in one read (os.read: a buffered file object costs more than the read)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 65536)
    except OSError:
        return None
    finally:
        os.close(fd)


class DrmClients:
    """Reads every DRM client on the machine, once per sample (see the module's notes on cost)."""

    def __init__(self, procfs: str = "/proc", sysfs: str = "/sys", rescan_s: float = RESCAN_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.procfs, self.sysfs = procfs, sysfs
        self.rescan_s = rescan_s
        self.clock = clock
        self._pids: dict[int, _Pid] = {}
        self._last: dict[tuple, tuple[float, DrmClient]] = {}
        self._nodes: dict[str, str | None] = {}  # "renderD128" -> its PCI address
        self.fd_scans = 0  # pids whose fd list was read (for the benchmark)

    def read(self) -> list[ClientUse]:
        now = self.clock()
        try:
            pids = sorted(int(name) for name in os.listdir(self.procfs) if name.isdigit())
        except OSError:
            return []
        for gone in self._pids.keys() - set(pids):
            del self._pids[gone]
        seen: dict[tuple, ClientUse] = {}
        last: dict[tuple, tuple[float, DrmClient]] = {}
        for pid in pids:
            entry = self._pids.get(pid)
            base = f"{self.procfs}/{pid}"
            if entry is None or now >= entry.rescan_at:
                entry = self._scan(pid, base, now)
                if entry is None:
                    continue
            for fd, node in entry.fds:
                data = _read(f"{base}/fdinfo/{fd}")
                client = parse_fdinfo(data.decode(errors="replace")) if data is not None else None
                if client is None:  # closed (maybe reopened as something else): look again next time
                    entry.rescan_at = now
                    continue
                address = client.pdev or self._node_address(node)
                if address is None:
                    continue
                key = (address, client.client_id) if client.client_id is not None else (address, pid, fd)
                if key in seen:
                    continue  # another fd of a client already counted
                before = self._last.get(key)
                busy = busy_percent(before[1], client, now - before[0]) if before is not None else None
                last[key] = (now, client)
                seen[key] = ClientUse(pid=pid, pci_address=address, vram=client.vram, busy=busy,
                                      primary=node.startswith("card"))
        self._last = last
        return list(seen.values())

    def _scan(self, pid: int, base: str, now: float) -> _Pid | None:
        """Which of the pid's fds are DRM files; None when the process is gone."""
        self.fd_scans += 1
        # Staggered by pid, so the fd lists of a thousand processes are not all read in one sample.
        entry = _Pid(rescan_at=now + self.rescan_s * (1 + (pid % 17) / 17))
        try:
            fds = os.listdir(f"{base}/fd")
        except FileNotFoundError:  # gone
            self._pids.pop(pid, None)
            return None
        except OSError:  # not ours to look into
            fds = []
        for fd in fds:
            try:
                match = _NODE.search(os.readlink(f"{base}/fd/{fd}"))
            except OSError:
                continue
            if match:
                entry.fds.append((fd, match.group(1)))
        self._pids[pid] = entry
        return entry

    def _node_address(self, node: str) -> str | None:
        if node not in self._nodes:
            self._nodes[node] = render_node_device(self.sysfs, node)
        return self._nodes[node]
