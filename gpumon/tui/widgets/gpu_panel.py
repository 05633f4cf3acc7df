"""One panel per card (the list that holds them is card_list.py).

A panel repaints only when what it shows changed. Full panels show every field the card reports;
compact panels (small terminals, many cards) fit a card in one line, bars included. Trouble is
shown on the card it concerns: a card that does not answer says for how long (the others keep
updating), an NVSwitch fabric that is not ready, recent XID errors, and its health verdict (WARN
or FAIL; nothing when ok: `h` tells the rest). In compact rows the verdict has a slot of its own
while any card has one (blank on the cards that are ok), so the rows line up whatever they say.
"""

from __future__ import annotations

import dataclasses

from rich.segment import Segment
from rich.text import Text
from textual.events import Click
from textual.message import Message
from textual.strip import Strip
from textual.widget import Widget

from gpumon.model import GpuSample
from gpumon.owners.holders import card_holder
from gpumon.tui.widgets.changed_cells import CachedStyles, PartialRefresh, line_segments
from gpumon.tui.widgets.unboxed_lines import draw_unboxed_lines
from gpumon.units import format_bytes
from gpumon.vendors import vendor

EIGHTHS = " ▏▎▍▌▋▊▉"
NA = "N/A"
MIN_NAME_CELLS = 12  # a card name cut shorter than this says too little: drop the identifiers instead
BADGE_CELLS = 30  # the most a compact row keeps for its badges (alerts, XIDs, no answer)
MARGIN = 1  # cells each side of a panel's text; the left one carries the selection mark
SELECTION_MARK = "▌"
VERDICT_WIDTH = 5  # " WARN", " FAIL", or blank: a fixed slot in compact rows
FABRIC_BADGE = {"not_started": "fabric not started", "in_progress": "fabric starting",
                "failed": "fabric failed", "degraded": "fabric degraded"}


def bar(fraction: float | None, width: int) -> tuple[str, str]:
    """(filled, empty) parts of a horizontal bar with 1/8-cell resolution."""
    if width <= 0:
        return "", ""
    if fraction is None:
        return "", " " * width
    cells = max(0.0, min(1.0, fraction)) * width
    full = int(cells)
    filled = "█" * full
    if full < width:
        filled += EIGHTHS[int((cells - full) * 8)].strip()
    return filled, " " * (width - len(filled))


def has_verdict(gpu: GpuSample) -> bool:
    """Does the card's panel show WARN or FAIL (a LOST card's badge says it already)?"""
    return gpu.health is not None and gpu.health.verdict != "ok" and gpu.state != "lost"


OWNER_CELLS = 32  # a longer owner (a pod's name) is cut with …
SHARE_CELLS, SHARE_CELLS_NARROW = 24, 20  # a compact row's column for who claims or reserved the card


def short_name(name: str) -> str:
    for prefix in ("NVIDIA ", "GeForce ", "Tesla "):
        name = name.replace(prefix, "")
    return name


def level(value: float | None, warn: float, crit: float) -> str:
    if value is None or value < warn:
        return "ok"
    return "warn" if value < crit else "crit"


class GpuPanel(CachedStyles, PartialRefresh, Widget):
    STYLE_PREFIX = "gpu-panel--"
    TEXT_X = MARGIN
    COMPONENT_CLASSES = {
        "gpu-panel--title", "gpu-panel--label", "gpu-panel--muted", "gpu-panel--bar",
        "gpu-panel--empty", "gpu-panel--ok", "gpu-panel--warn", "gpu-panel--crit", "gpu-panel--lost",
        "gpu-panel--selected", "gpu-panel--mark",
    }

    class Clicked(Message):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index

    def __init__(self, position: int) -> None:
        super().__init__(id=f"gpu-{position}")
        draw_unboxed_lines(self)
        self.position = position  # place in the list (not necessarily the NVML index)
        self.gpu: GpuSample | None = None
        self.stale = False
        self.ordinal: str | None = None
        self.alerts: tuple[str, ...] = ()
        self.xids: tuple[str, ...] = ()
        self.verdict_slot = False  # compact rows keep room for WARN/FAIL (some card has a verdict)
        self.shared: tuple[str, str] = ("", "")  # who claims or reserved it: in full, short
        self.share_slot = False  # compact rows keep a column for that (some card is shared)
        self._shown: tuple | None = None
        self._height = 0
        self.waiting = False  # names only, before the card's first sample
        self.selected = False

    def set_selected(self, selected: bool) -> None:
        """The panel draws its selection itself (a mark in its margin, a lighter background): a CSS
        class toggled would restyle the panel and lay the screen out again, which is most of what
        answering ↑/↓ cost."""
        if selected != self.selected:
            self.selected = selected
            self.refresh()

    def show(self, gpu: GpuSample, stale: bool, ordinal: str | None, alerts: tuple[str, ...] = (),
             xids: tuple[str, ...] = (), verdict_slot: bool = False, shared: tuple[str, str] = ("", ""),
             share_slot: bool = False) -> None:
        """`stale`: the whole sample is late (no new data at all); `xids`: recent XIDs, in words;
        `verdict_slot`: some card of the list has a health verdict to show; `shared`: who claims or
        reserved the card (sharing/view.card_words: in full, and short for a compact row); `share_slot`:
        some card of the list is claimed or reserved (compact rows keep a column for it)."""
        self.shared, self.share_slot = shared, share_slot
        key = (gpu, stale, ordinal, alerts, xids, verdict_slot, shared, share_slot)
        if key == self._shown:
            return
        self._shown = key
        self.waiting = False
        self.gpu, self.stale, self.ordinal, self.alerts, self.xids = gpu, stale, ordinal, alerts, xids
        self.verdict_slot = verdict_slot
        width = self._text_width()
        if width:
            self.show_lines(self.lines(width), width)  # repaints only the characters that changed
        else:
            self.refresh()

    def show_identity(self, gpu: GpuSample) -> None:
        """The card's name and ids before its first sample."""
        self.gpu, self.waiting = gpu, True
        self.refresh(layout=True)

    @property
    def compact(self) -> bool:
        return self.has_class("-compact")

    def on_click(self, event: Click) -> None:
        self.post_message(self.Clicked(self.position))

    def on_resize(self) -> None:
        self.shown = None
        self.refresh(layout=True)

    def get_content_height(self, container, viewport, width: int) -> int:
        return len(self.lines(width - 2 * MARGIN))

    def _text_width(self) -> int:
        return max(0, (self.content_region.width or self.size.width) - 2 * MARGIN)

    def _current_lines(self) -> list[Text]:
        width = self._text_width()
        lines = self.shown if self.shown is not None and width == self._shown_width else self.lines(width)
        if len(lines) != self._height:
            self._height = len(lines)
            self.call_after_refresh(self.refresh, layout=True)
        return lines

    def render(self) -> Text:
        return Text("\n").join(self._current_lines())

    def render_line(self, y: int) -> Strip:
        """One line, straight from its Text (Textual's way renders the whole panel for any change:
        ~1 ms a panel, every sample)."""
        lines = self._current_lines()
        width = self._text_width()
        outer = self.visual_style.rich_style
        base = outer + self._style("selected") if self.selected else outer
        left = Segment(SELECTION_MARK, outer + self._style("mark")) if self.selected else Segment(" " * MARGIN, base)
        text = line_segments(lines[y] if y < len(lines) else Text(), width, base, self.app.console)
        return Strip([left, *text, Segment(" " * MARGIN, base)], width + 2 * MARGIN)

    # -- building the lines --

    def _bar(self, label: str, fraction: float | None, width: int, tone: str, value: str) -> Text:
        filled, empty = bar(fraction, width)
        text = Text(label, style=self._style("label"))
        text.append("▕", style=self._style("muted"))
        text.append(filled, style=self._style(tone))
        text.append(empty, style=self._style("empty"))
        text.append("▏", style=self._style("muted"))
        text.append(value)
        return text

    def _title(self, gpu: GpuSample, width: int) -> Text:
        title = Text(f"{gpu.index} ", style=self._style("title"))
        name = Text(gpu.name, style=self._style("title"))
        right = Text(style=self._style("muted"))
        if gpu.uuid:
            right.append(gpu.uuid[:12])
        if self.ordinal is not None:
            right.append(f"  CUDA {self.ordinal}")
        if gpu.vendor_index is not None:  # its number in ROCm or Level Zero (PCI order)
            right.append(f"  {vendor(gpu.vendor).runtime_short} {gpu.vendor_index}")
        if gpu.pci_bus_id:
            right.append("  " + gpu.pci_bus_id.split(":", 1)[-1])
        if gpu.numa_node is not None:
            right.append(f"  NUMA {gpu.numa_node}")
        if gpu.mig_devices:
            right.append(f"  MIG×{len(gpu.mig_devices)}")
        if gpu.compute_mode not in (None, "default"):  # one process at a time, or none (nvidia-smi -c)
            right.append("  " + ("EXCL" if gpu.compute_mode.startswith("exclusive") else "NO CUDA"))
        badge = self._verdict(gpu) + self._badge(gpu)
        holder = card_holder(gpu)
        owner = Text(f"  {holder}" if holder else "", style=self._style("mark"))
        owner.truncate(OWNER_CELLS + 2, overflow="ellipsis")
        # Widths in cells. A long name is cut with … to leave room for the owner and the identifiers;
        # when even a short name does not fit beside them, the identifiers are dropped, then the owner.
        room = width - title.cell_len - owner.cell_len - right.cell_len - badge.cell_len - 1
        if room < min(name.cell_len, MIN_NAME_CELLS):
            right = Text()
            room = width - title.cell_len - owner.cell_len - badge.cell_len - 1
        if room < min(name.cell_len, MIN_NAME_CELLS):
            owner = Text()
            room = width - title.cell_len - badge.cell_len - 1
        name.truncate(max(1, room), overflow="ellipsis")
        title.append_text(name)
        title.append_text(owner)
        gap = max(1, width - title.cell_len - right.cell_len - badge.cell_len)
        line = title + Text(" " * gap) + right + badge
        line.truncate(width)
        return line

    def _verdict(self, gpu: GpuSample, slot: bool = False) -> Text:
        """WARN or FAIL in its colour; nothing when ok (or when LOST already says it). `slot`: always
        VERDICT_WIDTH cells."""
        if not has_verdict(gpu):
            return Text(" " * VERDICT_WIDTH if slot else "")
        verdict = gpu.health.verdict  # type: ignore[union-attr]
        word = Text(f" {verdict.upper()}", style=self._style("crit" if verdict == "fail" else "warn"))
        return word if slot else Text(" ") + word

    def _badge(self, gpu: GpuSample) -> Text:
        badge = Text()
        if gpu.state == "stale":
            badge.append("  ")
            badge.append(f" not responding for {gpu.stale_s or 0:.0f} s ", style=self._style("lost"))
        elif gpu.state != "ok":
            badge.append(f"  {gpu.state.upper()} ", style=self._style("lost"))
        if self.stale:
            badge.append("  no new data", style=self._style("warn"))
        if gpu.asleep:
            badge.append("  asleep", style=self._style("muted"))
        if gpu.fabric in FABRIC_BADGE:
            badge.append(f"  {FABRIC_BADGE[gpu.fabric]}", style=self._style("crit" if gpu.fabric != "in_progress"
                                                                             else "warn"))
        for xid in self.xids:
            badge.append(f"  {xid}", style=self._style("crit"))
        for alert in self.alerts:
            badge.append(f"  ⚠ {alert}", style=self._style("crit"))
        return badge

    def lines(self, width: int) -> list[Text]:
        gpu = self.gpu
        if gpu is None:
            return [Text("…")]
        width = max(width, 20)
        if self.waiting:
            return self._waiting_lines(gpu, width)
        if self.compact:
            return [self._compact_line(gpu, width)]
        lines = [self._title(gpu, width)]
        if gpu.state == "lost":
            lines.append(Text(f"  LOST: {gpu.error or 'GPU is lost'}. The card fell off the bus or needs a reset; "
                              "other cards keep updating.", style=self._style("lost")))
            return lines
        if gpu.state == "error":
            lines.append(Text(f"  ERROR: {gpu.error}", style=self._style("crit")))
        if gpu.asleep and gpu.state == "ok":
            lines.append(Text("  Asleep (the kernel suspended it): not read, so as not to wake it.",
                              style=self._style("muted")))
            return lines
        if gpu.state == "stale" and gpu.utilization_gpu is None and gpu.memory_used is None:
            lines.append(Text(f"  No answer for {gpu.stale_s or 0:.0f} s: its driver calls hang; the other cards "
                              "keep updating.", style=self._style("warn")))
            return lines
        if gpu.fabric == "not_started":
            lines.append(Text("  Fabric not started: CUDA cannot use this card until nvidia-fabricmanager "
                              "registers it.", style=self._style("crit")))
        bar_width = max(5, (width - 44) // 2)
        mem_pct = gpu.memory_percent
        mem_value = NA if gpu.memory_used is None else (
            f" {format_bytes(gpu.memory_used)}/{format_bytes(gpu.memory_total)} {mem_pct:3.0f}%")
        util_value = NA if gpu.utilization_gpu is None else f" {gpu.utilization_gpu:3d}%"
        bars = self._bar("UTIL ", _frac(gpu.utilization_gpu), bar_width, "bar", util_value.ljust(6))
        bars.append("  ")
        bars.append_text(self._bar("MEM ", _frac(mem_pct), bar_width, level(mem_pct, 80, 95), mem_value))
        lines.append(bars)
        lines.extend(_flow(self._detail_tokens(gpu), width))
        if self.shared[0]:
            said = self.shared[0][0].upper() + self.shared[0][1:]
            lines.append(Text(f"  {said[:width - 2]}", style=self._style("mark")))
        return lines

    def _waiting_lines(self, gpu: GpuSample, width: int) -> list[Text]:
        note = Text("not answering yet" if gpu.state == "stale" else "reading…", style=self._style("muted"))
        if self.compact:
            line = Text(f"{gpu.index:>2} ", style=self._style("title"))
            line.append_text(Text(short_name(gpu.name) if gpu.state != "stale" else "", style=self._style("title")))
            line.append("  ")
            line.append_text(note)
            line.truncate(width)
            return [line]
        return [self._title(dataclasses.replace(gpu, state="ok"), width), Text("  ") + note]

    def _detail_tokens(self, gpu: GpuSample) -> list[Text]:
        # Every field is always present and padded to a fixed width, so a panel's height depends
        # only on the terminal width: panels never jump when a value or throttle reason changes.
        throttled = [r for r in gpu.throttle_reasons or () if r not in ("gpu_idle", "applications_clocks")]
        throttle = ",".join(throttled) if throttled else ("none" if gpu.throttle_reasons is not None else None)
        return [
            self._field("TEMP", f"{gpu.temperature}°C" if gpu.temperature is not None else None, 5,
                        level(gpu.temperature, 80, 87)),
            *([self._field("HOTSPOT", f"{hot}°C" if (hot := gpu.temperature_junction) is not None else None, 5,
                           level(hot, 95, 105))] if vendor(gpu.vendor).hotspot else []),
            self._field("FAN", _pct(gpu.fan), 4),
            self._field("POWER", _power(gpu), 9, level(gpu.power_percent, 90, 98)),
            self._field("SM", f"{gpu.clock_sm}MHz" if gpu.clock_sm is not None else None, 7),
            self._field("MEMCLK", f"{gpu.clock_mem}MHz" if gpu.clock_mem is not None else None, 8),
            self._field("", gpu.pstate, 3),
            self._field("ENC", _pct(gpu.encoder_util), 4),
            self._field("DEC", _pct(gpu.decoder_util), 4),
            self._field("PCIe", _pcie(gpu), 17),
            self._field("ECC", None if gpu.ecc_errors_uncorrected is None else str(gpu.ecc_errors_uncorrected), 3,
                        "crit" if gpu.ecc_errors_uncorrected else "ok"),
            self._field("THROTTLE", throttle, 24, "warn" if throttled else "ok"),
        ]

    def _field(self, label: str, value: str | None, width: int, tone: str = "ok") -> Text:
        text = Text(f"{label} " if label else "", style=self._style("label"))
        if value is None:
            text.append(NA.ljust(width), style=self._style("muted"))
        else:
            if len(value) > width:
                value = value[: width - 1] + "…"
            text.append(value.ljust(width), style=self._style(tone) if tone != "ok" else "")
        return text

    def _compact_line(self, gpu: GpuSample, width: int) -> Text:
        line = Text(f"{gpu.index:>2} ", style=self._style("title"))
        name = Text(short_name(gpu.name), style=self._style("title"))
        name.truncate(16 if width >= 76 else 10, overflow="ellipsis", pad=True)  # cells, not characters
        line.append_text(name)
        if self.ordinal is not None:  # what programs started from this shell call the card
            label = "no CUDA" if self.ordinal == "hidden" else f"CUDA {self.ordinal}"
            line.append(f" {label:<7}", style=self._style("muted"))
        if gpu.state == "lost":
            line.append(f"  LOST: {gpu.error or 'GPU is lost'}"[: width - line.cell_len], style=self._style("lost"))
            return line
        # Every part has the same width on every row, whatever it holds (a badge, N/A, no power
        # reading, a verdict), so the bars of all cards start and end in the same columns.
        tail = Text(f" {gpu.temperature:>3}°C" if gpu.temperature is not None else " " * 6,
                    style=self._style(level(gpu.temperature, 80, 87)))
        tail.append(f" {gpu.power_draw:>4.0f}W" if gpu.power_draw is not None else " " * 6)
        if self.verdict_slot:
            tail.append_text(self._verdict(gpu, slot=True))
        if self.share_slot:  # who has it, in a column of its own on every row while any card is shared
            cells = SHARE_CELLS if width >= 100 else SHARE_CELLS_NARROW
            who = Text(f" {self.shared[1]}", style=self._style("mark"))
            who.truncate(cells, overflow="ellipsis", pad=True)
            tail.append_text(who)
        mem_pct = gpu.memory_percent
        mem_value = (NA if gpu.memory_used is None
                     else f"{format_bytes(gpu.memory_used)}/{format_bytes(gpu.memory_total)}").rjust(10)
        util_value = (NA if gpu.utilization_gpu is None else f"{gpu.utilization_gpu:3d}%").rjust(4)
        room = width - line.cell_len - 2 * 4 - 4 - 10 - tail.cell_len
        badge_room = min(BADGE_CELLS, room // 3)  # kept on every row: alerts come and go
        bar_width = max(3, (room - badge_room) // 2)
        line.append(" ")
        line.append_text(self._bar("", _frac(gpu.utilization_gpu), bar_width, "bar", util_value))
        line.append(" ")
        line.append_text(self._bar("", _frac(mem_pct), bar_width, level(mem_pct, 80, 95), mem_value))
        line.append_text(tail)
        badge = self._badge(gpu)
        badge.truncate(max(0, width - line.cell_len), overflow="ellipsis")
        line.append_text(badge)
        line.truncate(width)
        return line


def _frac(percent: float | None) -> float | None:
    return None if percent is None else percent / 100


def _pct(value: int | None) -> str | None:
    return None if value is None else f"{value}%"


def _power(gpu: GpuSample) -> str | None:
    if gpu.power_draw is None:
        return None
    limit = f"/{gpu.power_limit:.0f}" if gpu.power_limit else ""
    return f"{gpu.power_draw:.0f}{limit}W"


def _pcie(gpu: GpuSample) -> str | None:
    if gpu.pcie_tx is None and gpu.pcie_rx is None:  # the kernel gives the link, not its traffic
        if gpu.pcie_link_speed is None:
            return None
        return f"{gpu.pcie_link_speed:g}GT/s x{gpu.pcie_link_width or '?'}"
    return f"▲{format_bytes(gpu.pcie_tx)}/s ▼{format_bytes(gpu.pcie_rx)}/s"


def _flow(tokens: list[Text], width: int) -> list[Text]:
    """Lay tokens out left to right, wrapping to a new line when the next one does not fit."""
    lines: list[Text] = []
    line = Text("")
    for token in tokens:
        if len(line) and len(line) + 2 + len(token) > width:
            lines.append(line)
            line = Text("")
        if len(line):
            line.append("  ")
        line.append_text(token)
    if len(line):
        lines.append(line)
    return lines
