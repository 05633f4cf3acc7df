"""An amdgpu card's RAS (reliability) counters, from sysfs: its health counters.

What the kernel writes (drivers/gpu/drm/amd/amdgpu/amdgpu_ras.c, Documentation/gpu/amdgpu/ras.rst),
under the card's `device/ras/`, only on boards with RAS (Instinct, some Radeon Pro):

    features                "feature mask: 0x%x"  (the blocks whose RAS is on; 0: none)
    <block>_err_count       "ue: N\\nce: M\\n" (newer kernels add "de: K", deferred errors) for each
                            block with RAS on: umc (the memory), gfx, sdma, mmhub, xgmi_wafl, …;
                            "Query currently inaccessible" while the driver cannot ask (a reset)
    gpu_vram_bad_pages      "0x%08x : 0x%08x : R|P|F" a line per bad page of VRAM (its pfn, its
                            size): R reserved (retired), P pending (retired at the next chance),
                            F the driver could not reserve it; absent with bad_page_threshold=0

The counts are the driver's own totals since it loaded (reading one asks the hardware and adds
what it found; the bad pages are kept in the board's EEPROM across boots). A card without RAS has
no `ras/` directory: nothing here is known of it, and `read_ras` answers None.

Read every `[health] interval` like NVIDIA's counters, never for a card asleep: each read asks the
card's firmware.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpumon.cards.backends.drm.kinds import BY_VENDOR
from gpumon.cards.backends.drm.sysfs import CardNode, read_text
from gpumon.health import rules as health
from gpumon.health.history import HealthTracker
from gpumon.model import GpuSample

_COUNT = re.compile(r"^\s*(ue|ce)\s*:\s*(\d+)\s*$", re.MULTILINE)
_BAD_PAGE = re.compile(r"^\s*0x[0-9a-fA-F]+\s*:\s*0x[0-9a-fA-F]+\s*:\s*([RPF])\s*$", re.MULTILINE)
ERR_COUNT = "_err_count"


@dataclass(frozen=True, slots=True)
class RasCounts:
    uncorrectable: int | None  # summed over the blocks that answered; None: none did
    correctable: int | None
    blocks: tuple[str, ...]  # the blocks that answered
    reserved: int | None  # bad pages retired (R); None: no bad-pages file
    pending: int | None  # waiting to be retired (P)
    failed: int | None  # could not be retired (F)


def _counts(text: str | None) -> tuple[int, int] | None:
    """(ue, ce) of one block's file; None when it says neither (inaccessible, or unreadable)."""
    found = dict(_COUNT.findall(text or ""))
    if "ue" not in found and "ce" not in found:
        return None
    return int(found.get("ue", 0)), int(found.get("ce", 0))


def _bad_pages(text: str) -> tuple[int, int, int]:
    flags = _BAD_PAGE.findall(text)
    return flags.count("R"), flags.count("P"), flags.count("F")


def read_ras(device: str) -> RasCounts | None:
    """The card's RAS counters; None when none could be read (no `ras/` directory, RAS off in
    every block, or every block inaccessible). `features` is not read: its mask says which blocks
    are on, and exactly those have an <block>_err_count file."""
    ras = os.path.join(device, "ras")
    try:
        names = sorted(os.listdir(ras))
    except OSError:
        return None  # no RAS on this board, or an older kernel
    ue = ce = None
    blocks = []
    for name in names:
        if not name.endswith(ERR_COUNT):
            continue
        counts = _counts(read_text(os.path.join(ras, name)))
        if counts is not None:
            ue, ce = (ue or 0) + counts[0], (ce or 0) + counts[1]
            blocks.append(name[: -len(ERR_COUNT)])
    pages = read_text(os.path.join(ras, "gpu_vram_bad_pages")) if "gpu_vram_bad_pages" in names else None
    reserved, pending, failed = _bad_pages(pages) if pages is not None else (None, None, None)
    if not blocks and pages is None:
        return None  # RAS off in every block, or no block can be asked now (a reset)
    return RasCounts(ue, ce, tuple(blocks), reserved, pending, failed)


def as_counters(ras: RasCounts) -> dict[str, Any]:
    """CardCounters' fields from RAS counts, for HealthTracker.card. The counts are since the driver
    loaded, as NVIDIA's volatile ECC counts are (the uncorrectable one is GpuSample's
    ecc_errors_uncorrected); amdgpu does not say whether a bad page came from one bit or two, so
    its pages are counted apart from NVIDIA's single- and double-bit retired pages."""
    return dict(ecc_errors_corrected=ras.correctable,
                retired_pages_pending=None if ras.pending is None else ras.pending > 0,
                retired_pages_reserved=ras.reserved, retired_pages_failed=ras.failed)


# Why a card has no counters, in the verdict's note (the `no_counters` rule); else its kind's words.
ASLEEP = "not read while the card sleeps, so as not to wake it"


@dataclass
class _Read:
    at: float  # clock time of the read
    raw: dict[str, Any] | None  # CardCounters' fields; None: nothing could be read
    uncorrectable: int | None


class RasHealth:
    """Each AMD and Intel card's counters and verdict, drawn as NVIDIA's are (HealthTracker, the
    same rules) from what the kernel tells: the RAS counts of an amdgpu card, read every
    `[health] interval` and handed out unchanged in between. A card that sleeps keeps the counters
    of its last read (a bad page pending before it slept is still pending), or says it was not read."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 settings: health.HealthSettings = health.HealthSettings()) -> None:
        self.clock = clock
        self.tracker = HealthTracker(settings)
        self._reads: dict[str, _Read] = {}

    def judge(self, node: CardNode, gpu: GpuSample) -> GpuSample:
        """The card's sample with its counters, its volatile uncorrectable count and its verdict."""
        key = gpu.uuid or f"pci:{node.pci_address}"
        now = time.time()
        if gpu.state == "lost":
            self._reads.pop(node.pci_address, None)  # a card that comes back is read afresh
            return dataclasses.replace(gpu, health=self.tracker.card(key, "lost", now, vendor=node.vendor)[1])
        if gpu.state != "ok":
            return gpu  # an error reading it: no verdict, as for NVIDIA's cards that cannot be read
        read = self._read(node, asleep=bool(gpu.asleep))
        if read is None:
            unread: str | None = ASLEEP
        elif read.raw is None:
            unread = BY_VENDOR[node.vendor].no_counters
        else:
            unread = None
        counters, verdict = self.tracker.card(key, "ok", now, read.raw if read else None,
                                              ecc_uncorrected=read.uncorrectable if read else None,
                                              vendor=node.vendor, unread=unread)
        return dataclasses.replace(gpu, counters=counters, health=verdict,
                                   ecc_errors_uncorrected=read.uncorrectable if read else None)

    def _read(self, node: CardNode, asleep: bool) -> _Read | None:
        """The card's counters, read again once the interval has passed; None: asleep, never read."""
        last = self._reads.get(node.pci_address)
        now = self.clock()
        if asleep or (last is not None and now - last.at < self.tracker.settings.interval_s):
            return last
        ras = read_ras(node.device) if BY_VENDOR[node.vendor].ras else None
        self._reads[node.pci_address] = last = _Read(now, as_counters(ras) if ras else None,
                                                     ras.uncorrectable if ras else None)
        return last
