"""The users view's table: one row per user, with its jobs, pods and containers under it
(monitor/holders.py `Holder`), drawn line by line as the process table is.

Rows keep their keys (host, kind, id) from sample to sample; on each sample only the cells whose
text changed are repainted (usually the ticking HELD/IDLE and the SM and power cells), and nothing
when a sample changes nothing on screen. Sorting keeps each user's rows together: users are ordered
by the sort column, and their jobs under them by the same column.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip

from gpumon.monitor.holders import Holder, idle_cell
from gpumon.sanitize import printable
from gpumon.tui.widgets.line_table import LineTable
from gpumon.units import format_bytes, format_duration, format_energy

# (key, header, right-aligned, most cells: longer text is cut with …)
COLUMNS = [("mark", "", False, 1), ("host", "HOST", False, 20), ("who", "WHO", False, 40),
           ("user", "USER", False, 16), ("cards", "CARDS", False, 16), ("mem", "MEM", True, 8),
           ("sm", "SM%", True, 5), ("power", "POWER", True, 7), ("energy", "ENERGY", True, 10),
           ("held", "HELD", True, 7), ("idle", "IDLE", True, 7)]
KEYS = [c[0] for c in COLUMNS]
HOST = KEYS.index("host")
IDLE_MARK = "!"  # idle rows stand out without colour too
# Sort keys `s` cycles through, with the direction each starts in (True: largest first).
SORTS = {"who": False, "idle": True, "mem": True, "sm": True, "power": True, "energy": True, "held": True}
SORT_VALUES = {
    "who": lambda h: (h.host, h.label.lower()), "idle": lambda h: -1.0 if h.idle_s is None else h.idle_s,
    "mem": lambda h: h.gpu_memory or 0, "sm": lambda h: -1 if h.sm_util is None else h.sm_util,
    "power": lambda h: h.power_w or 0.0, "energy": lambda h: h.energy_j or 0.0, "held": lambda h: h.held_s or 0.0,
}
GAP = 2


@lru_cache(maxsize=4096)
def _text(value: str | None) -> str:
    """A name from elsewhere (a user, a pod, a host) as it may be shown: control characters visible."""
    return printable(value or "?")


def _cut(text: str, cells: int) -> str:
    if (len(text) if text.isascii() else cell_len(text)) <= cells:
        return text
    return set_cell_size(text, cells - 1) + "…" if cells > 1 else text[:cells]


def cells_of(h: Holder, child: str) -> tuple[str, ...]:
    """A row's cells; `child`: the tree mark of a job/pod/container under its user ('' for a user)."""
    return (IDLE_MARK if h.idle else "", _text(h.host), child + _text(h.label),
            _text(h.user), ",".join(map(str, h.cards)) or "-", format_bytes(h.gpu_memory),
            "N/A" if h.sm_util is None else str(h.sm_util),
            "N/A" if h.power_w is None else f"{h.power_w:.0f}W",
            format_energy(h.energy_j, na="N/A"), "N/A" if h.held_s is None else format_duration(h.held_s),
            idle_cell(h))


def groups(holders: tuple[Holder, ...]) -> list[tuple[Holder, list[Holder]]]:
    """Each user's row with its jobs', pods' and containers' rows (the tracker lists them so)."""
    out: list[tuple[Holder, list[Holder]]] = []
    by_user: dict[tuple[str, str | None], list[Holder]] = {}
    for h in holders:
        if h.kind == "user":
            children: list[Holder] = []
            by_user[h.host, h.user] = children
            out.append((h, children))
        elif (h.host, h.user) in by_user:
            by_user[h.host, h.user].append(h)
        else:  # not expected: a job always counts for its user too
            out.append((h, []))
    return out


def matches(h: Holder, needle: str) -> bool:
    return needle in " ".join(x for x in (h.host, h.label, h.id, h.user, h.kind) if x).lower()


@dataclass(frozen=True, slots=True)
class Line:
    holder: Holder
    cells: tuple[str, ...]


class HolderTable(LineTable):
    COMPONENT_CLASSES = {"holder-table--header", "holder-table--cursor", "holder-table--idle",
                         "holder-table--child"}
    BINDINGS = [
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("k", "cursor(-1)", show=False),
        Binding("j", "cursor(1)", show=False),
    ]

    class SortChanged(Message):
        """The sort column or direction changed."""

    def __init__(self, hosts: bool = False, **kwargs) -> None:
        """`hosts`: a HOST column (the fleet's view)."""
        super().__init__(**kwargs)
        self.hosts = hosts
        self.sort_key = "who"
        self.sort_reverse = False
        self.filter_text = ""
        self.lines: dict[str, Line] = {}
        self.widths = [0] * len(COLUMNS)
        self._styles: dict[str, Style] | None = None
        self._holders: tuple[Holder, ...] = ()

    # -- data in --

    def show(self, holders: tuple[Holder, ...]) -> None:
        """Show these holders (filtered and sorted), repainting only the cells that changed."""
        self._holders = holders
        cursor_key = self.order[self.cursor] if self.order and self.cursor < len(self.order) else None
        value = SORT_VALUES[self.sort_key]
        needle = self.filter_text.lower()
        lines: dict[str, Line] = {}
        order: list[str] = []
        for user, children in sorted(groups(holders), key=lambda g: value(g[0]), reverse=self.sort_reverse):
            if needle and not matches(user, needle):
                children = [c for c in children if matches(c, needle)]
                if not children:
                    continue
            if self.sort_key != "who":
                children = sorted(children, key=value, reverse=self.sort_reverse)
            for i, h in enumerate([user, *children]):
                child = "" if i == 0 else ("└ " if i == len(children) else "├ ")
                key = f"{h.host}\0{h.kind}\0{h.id}"
                lines[key] = Line(h, cells_of(h, child))
                order.append(key)
        widths = [0 if i == HOST and not self.hosts else 1 if i == 0 else
                  min(most, max([cell_len(label) + (1 if label else 0)]
                                + [cell_len(line.cells[i]) for line in lines.values()]))
                  for i, (_, label, _, most) in enumerate(COLUMNS)]
        old, old_order = self.lines, self.order
        self.lines = lines
        if cursor_key in lines:
            self.cursor = order.index(cursor_key)
        self.cursor = max(0, min(self.cursor, len(order) - 1))
        if order != old_order or widths != self.widths:
            self.order, self.widths = order, widths
            self._set_virtual_height()
            self._strips.clear()
            self.refresh()
            return
        top = self.scroll_offset.y
        regions = []
        for index in range(top, min(len(order), top + self.size.height - 1)):
            key = order[index]
            before, after = old.get(key), lines[key]
            if before is None or before.cells != after.cells or before.holder.idle != after.holder.idle:
                changed = [i for i, (a, b) in enumerate(zip(before.cells, after.cells)) if a != b] \
                    if before is not None and before.holder.idle == after.holder.idle else list(range(len(KEYS)))
                regions.append(self._cells_region(index - top + 1, changed))
        if regions:
            self.refresh(*regions)

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self.show(self._holders)

    # -- drawing --

    def _x(self, column: int) -> int:
        return 1 + sum(w + GAP for w in self.widths[:column] if w)

    def _cells_region(self, y: int, columns: list[int]) -> Region:
        start = self._x(min(columns))
        end = self._x(max(columns)) + self.widths[max(columns)]
        return Region(start, y, max(1, end - start), 1)

    def _style(self, name: str) -> Style:
        if self._styles is None:
            self._styles = {}
        style = self._styles.get(name)
        if style is None:
            style = self._styles[name] = self.get_component_rich_style(f"holder-table--{name}")
        return style

    def notify_style_update(self) -> None:
        self._styles = None
        self._strips.clear()
        super().notify_style_update()

    def _line(self, texts: tuple[str, ...], width: int, base: Style) -> Strip:
        parts = [" "]
        for i, (_, _, right, _) in enumerate(COLUMNS):
            cells = self.widths[i]
            if not cells:
                continue
            text = _cut(texts[i], cells)
            pad = " " * (cells - cell_len(text))
            parts.append((pad + text if right else text + pad) + " " * GAP)
        return Strip([Segment("".join(parts), base)]).crop_extend(0, width, base)

    def _header(self, width: int) -> Strip:
        labels = tuple(self.header_label(key) for key in KEYS)
        return self._line(labels, width, self._style("header"))

    def _row_strip(self, index: int, width: int) -> Strip:
        key = self.order[index]
        line = self.lines[key]
        on_cursor = index == self.cursor and self.has_focus
        signature = (line.cells, line.holder.idle, tuple(self.widths), width, on_cursor)
        cached = self._strips.get(key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        base = Style()
        if line.holder.idle:
            base = self._style("idle")
        elif line.holder.kind != "user":
            base = self._style("child")
        if on_cursor:
            base = base + self._style("cursor")
        strip = self._line(line.cells, width, base)
        self._strips[key] = (signature, strip)
        return strip

    def on_focus(self) -> None:
        self._refresh_row(self.cursor)

    def on_blur(self) -> None:
        self._refresh_row(self.cursor)

    # -- what tests and the screen read --

    @property
    def row_count(self) -> int:
        return len(self.order)

    def cell_text(self, index: int, column: str) -> str:
        return self.lines[self.order[index]].cells[KEYS.index(column)]

    def holder_at(self, index: int) -> Holder:
        return self.lines[self.order[index]].holder

    def header_label(self, column: str) -> str:
        label = next(c[1] for c in COLUMNS if c[0] == column)
        return label + ("▼" if self.sort_reverse else "▲") if column == self.sort_key else label

    # -- sorting --

    def header_clicked(self, x: int) -> None:
        column = next((KEYS[i] for i in reversed(range(len(KEYS))) if self.widths[i] and x >= self._x(i)), None)
        if column in SORTS:
            if column == self.sort_key:
                self.sort_reverse = not self.sort_reverse
            else:
                self.sort_key, self.sort_reverse = column, SORTS[column]
            self._resort()

    def _resort(self) -> None:
        self.order = []  # a full repaint in the new order
        self.show(self._holders)
        self.post_message(self.SortChanged())

    def action_cycle_sort(self) -> None:
        keys = list(SORTS)
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.sort_reverse = SORTS[self.sort_key]
        self._resort()

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._resort()
