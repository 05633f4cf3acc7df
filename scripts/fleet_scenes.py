"""A stand-in fleet for the TUI's tests and screenshots: hosts whose news the test reports itself.

`scene_fleet(names)` is a real `Fleet` whose only source never reads anything; a test (on the
app's loop) calls `fleet.report(HOST, STATE, snapshot=machine(...))` as a real source would. The
real ssh source is covered by the tests that start sshd; this keeps Pilot tests fast and exact.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Callable, Sequence

from gpumon.counters import Health, HealthReason
from gpumon.fleet import Fleet, Source
from gpumon.model import GpuSample, MigSample, Snapshot
from gpumon.remote.hosts import parse_hosts

GIB = 1 << 30


class SceneSource(Source):
    kind = "gpumon"

    def __init__(self, names: Sequence[str]) -> None:
        self.hosts = tuple(names)

    async def run(self, fleet: Fleet) -> None:
        await asyncio.Event().wait()  # reports come from the test


def scene_fleet(names: Sequence[str], interval: float = 1.0, clock: Callable[[], float] | None = None) -> Fleet:
    specs = parse_hosts(",".join(names))
    extra = {"clock": clock} if clock is not None else {}
    return Fleet(specs, [SceneSource([s.name for s in specs])], interval, **extra)


def card(index: int, util: int | None = 0, mem_pct: float | None = 0.0, temp: int | None = 40, host: str = "h",
         state: str = "ok", mig: int = 0, total: int = 80 * GIB, name: str = "NVIDIA H100 80GB HBM3",
         health: str | None = None) -> GpuSample:
    """`health`: the card's verdict ("ok", "warn", "fail" with a reason of the same code), None: none."""
    used = None if mem_pct is None else int(total * mem_pct / 100)
    return GpuSample(
        index=index, uuid=f"GPU-{zlib.crc32(host.encode()):08x}-0000-1111-2222-{index:012d}", name=name,
        pci_bus_id=f"00000000:{0x10 + index:02X}:00.0", state=state, utilization_gpu=util, memory_total=total,
        memory_used=used, memory_free=None if used is None else total - used, temperature=temp,
        power_draw=None if util is None else 80.0 + 3 * util, power_limit=700.0,
        mig_mode=bool(mig) or None,
        mig_devices=tuple(MigSample(f"MIG-{index}-{i}", "1g.10gb", 10 * GIB, GIB) for i in range(mig)),
        error="GPU is lost" if state == "lost" else None, stale_s=12.0 if state == "stale" else None,
        health=None if health is None else Health(health, () if health == "ok" else (VERDICT_REASONS[health],)))


VERDICT_REASONS = {
    "warn": HealthReason("pcie_replays", "PCIe replays climbing: 30 a minute (more than 8)", "reseat the card"),
    "fail": HealthReason("remap_pending", "a row remap is pending", "reset the card to apply pending row remaps")}


def machine(host: str, cards: Sequence[GpuSample], time: float = 1_767_225_600.0) -> Snapshot:
    return Snapshot(time, host, "nvml", "550.54.15", "12.4", tuple(cards))
