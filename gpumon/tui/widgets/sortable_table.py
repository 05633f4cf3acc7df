"""A LineTable of named columns that the user sorts: `s` cycles through the sort columns, `S`
reverses the order, and a click on a column's header sorts by it (a second click reverses).

The process table and the users view's table are this. Each row is a tuple of cells, the text of
each column; on each sample a subclass hands over the rows in its order (`_show_cells`), and only
the cells whose text changed are repainted, all on one refresh, and only on rows on screen. A
subclass says its columns, how a row's cells are made and styled (`_styled_row`) and what a new
sort must redo (`_reshow`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip

from gpumon.tui.widgets.line_table import LineTable

GAP = 2
SPACING = " " * GAP
PLAIN = Style()

# A row's cells: the text of each column.
Cells = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Column:
    key: str
    label: str
    right: bool = False  # right-aligned
    most: int | None = None  # the most cells it takes: longer text is cut with …
    ascii: bool = False  # its text is ASCII: measured by len, cheaper than counting terminal cells


def fit(text: str, cells: int) -> str:
    """`text` in at most `cells` terminal cells (wide characters take two), ending in … when cut."""
    if (len(text) if text.isascii() else cell_len(text)) <= cells:
        return text
    if cells <= 0:
        return ""
    # set_cell_size pads with a space where a wide character would have been split in two.
    return (text[: cells - 1] if text.isascii() else set_cell_size(text, cells - 1)) + "…"


class SortableTable(LineTable):
    COLUMNS: ClassVar[tuple[Column, ...]] = ()
    # The sort keys `s` cycles through, with the direction each starts in (True: largest first);
    # the first is the table's sort at start.
    SORTS: ClassVar[dict[str, bool]] = {}
    # The last column takes what is left of the line (it is not measured, and its width is 0).
    STRETCH: ClassVar[bool] = False
    # Columns whose change changes the style of the whole row, so the whole row is repainted.
    WHOLE_ROW: ClassVar[frozenset[int]] = frozenset()

    BINDINGS = [
        Binding("s", "cycle_sort", "Sort", show=False),  # each table's frame says `s sort`
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("k", "cursor(-1)", show=False),
        Binding("j", "cursor(1)", show=False),
    ]

    class SortChanged(Message):
        """The sort column or direction changed (a subclass's own, so that its handler is named by it)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.sort_key = next(iter(self.SORTS))
        self.sort_reverse = self.SORTS[self.sort_key]
        self.widths: list[int] = [len(c.label) + 1 for c in self.COLUMNS]  # in cells; 0: left out
        self._cells: dict[str, Cells] = {}
        self._index = {c.key: i for i, c in enumerate(self.COLUMNS)}
        self._right = [c.right for c in self.COLUMNS]
        self._style_cache: dict[str, Style] | None = None
        self._combined: dict[tuple[Style, Style], Style] = {}  # a cell's style, by row style and cell style

    # -- for subclasses --

    def _styled_row(self, key: str, cells: Cells, on_cursor: bool) -> tuple[list[tuple[str, Style]], Style]:
        """Each cell's text and style, and the row's style under them."""
        raise NotImplementedError

    def _reshow(self) -> None:
        """After a new sort (`order` emptied): show the rows in it, or wait for the next sample."""
        self.refresh()

    def _content_widths(self, cells: dict[str, Cells]) -> list[int]:
        """Each column as wide as its widest cell, or its label with room for the sort arrow, and
        at most its `most`; a stretching last column 0."""
        columns = list(zip(*cells.values())) or [()] * len(self.COLUMNS)
        measured = self.COLUMNS[:-1] if self.STRETCH else self.COLUMNS
        widths = []
        for column, texts in zip(measured, columns):
            width = max([cell_len(column.label) + (1 if column.label else 0)]
                        + list(map(len if column.ascii else cell_len, texts)))
            widths.append(width if column.most is None else min(column.most, width))
        if self.STRETCH:
            widths.append(0)
        return widths

    def _show_cells(self, order: list[str], cells: dict[str, Cells], widths: list[int]) -> None:
        """Show these rows (their keys top to bottom, and each one's cells) at these column widths,
        repainting only the cells that changed; everything when the order or the widths changed.
        The cursor stays on its row."""
        cursor_key = self.order[self.cursor] if self.order and self.cursor < len(self.order) else None
        old_cells, old_order = self._cells, self.order
        self._cells = cells
        if cursor_key in cells:
            self.cursor = order.index(cursor_key)
        self.cursor = max(0, min(self.cursor, len(order) - 1))
        if order != old_order or widths != self.widths:
            self.order, self.widths = order, widths
            self._set_virtual_height()
            self._strips.clear()
            self.refresh()
            return
        self.order = order
        # Only rows on screen are repainted (the others are drawn afresh when scrolled to), all
        # in one refresh: each refresh call costs Textual more than drawing a row.
        every = range(len(self.COLUMNS))
        top = self.scroll_offset.y
        regions = []
        for index in range(top, min(len(order), top + self.size.height - 1)):
            before, after = old_cells.get(order[index]), cells[order[index]]
            if before != after:
                changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b] if before else list(every)
                if self.WHOLE_ROW and not self.WHOLE_ROW.isdisjoint(changed):
                    changed = list(every)
                regions.append(self._cells_region(index - top + 1, changed))
        if regions:
            self.refresh(*regions)

    # -- drawing --

    def _x(self, column: int) -> int:
        return 1 + sum(w + GAP for w in self.widths[:column] if w)

    def _cells_region(self, y: int, columns: list[int]) -> Region:
        """The region of these cells on line `y` of the view."""
        start = self._x(min(columns))
        last = max(columns)
        end = self.size.width if self.STRETCH and last == len(self.COLUMNS) - 1 else self._x(last) + self.widths[last]
        return Region(start, y, max(1, end - start), 1)

    def _styles(self) -> dict[str, Style]:
        """The component classes' styles, by the name after the `--`."""
        # Textual drops its own cache of these at every refresh; they change only with the CSS.
        if self._style_cache is None:
            self._style_cache = {name.partition("--")[2]: self.get_component_rich_style(name)
                                 for name in self.COMPONENT_CLASSES}
        return self._style_cache

    def notify_style_update(self) -> None:
        self._style_cache = None
        self._combined.clear()
        self._strips.clear()
        super().notify_style_update()

    def _line(self, texts: list[tuple[str, Style]], width: int, base: Style) -> Strip:
        # Neighbouring cells in the same style make one segment: fewer segments for Textual to cut,
        # and the output layer sends only the cells that changed whatever the segments are.
        segments: list[Segment] = []
        run, run_style = [" "], base
        combined, widths, right = self._combined, self.widths, self._right
        stretching = len(widths) - 1 if self.STRETCH else -1
        used = 1
        for i, (text, style) in enumerate(texts):
            if not widths[i] and i != stretching:  # a column left out
                continue
            cell_style = combined.get((base, style))
            if cell_style is None:
                cell_style = combined[base, style] = base + style
            if cell_style != run_style:
                segments.append(Segment("".join(run), run_style))
                run, run_style = [], cell_style
            if i != stretching:
                cells = len(text) if text.isascii() else cell_len(text)
                if cells > widths[i]:  # a narrowed column, or one at its `most`
                    text, cells = fit(text, widths[i]), widths[i]
                pad = " " * (widths[i] - cells)
                run.append((pad + text if right[i] else text + pad) + SPACING)
                used += widths[i] + GAP
            else:  # what is left of the line, cut with … when the text does not fit
                room = max(0, width - used)
                text = fit(text, room)
                run.append(text)
                rest = room - (len(text) if text.isascii() else cell_len(text))
                if rest > 0:
                    segments.append(Segment("".join(run), run_style))
                    run, run_style = [" " * rest], base
        segments.append(Segment("".join(run), run_style))
        if used > width or not self.STRETCH:  # cut (a narrow view) or filled to the width
            return Strip(segments).crop_extend(0, width, base)
        return Strip(segments, width)

    def _header(self, width: int) -> Strip:
        texts = [(self.header_label(c.key), PLAIN) for c in self.COLUMNS]
        return self._line(texts, width, self._styles()["header"])

    def _row_strip(self, index: int, width: int) -> Strip:
        key = self.order[index]
        cells = self._cells[key]
        on_cursor = index == self.cursor and self.has_focus
        signature = (cells, tuple(self.widths), width, on_cursor)
        cached = self._strips.get(key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        texts, base = self._styled_row(key, cells, on_cursor)
        strip = self._line(texts, width, base)
        self._strips[key] = (signature, strip)
        return strip

    # The cursor is drawn only while the table has focus.
    def on_focus(self) -> None:
        self._refresh_row(self.cursor)

    def on_blur(self) -> None:
        self._refresh_row(self.cursor)

    # -- what tests and screens read --

    def cell_text(self, index: int, column: str) -> str:
        return self._cells[self.order[index]][self._index[column]]

    def header_label(self, column: str) -> str:
        label = self.COLUMNS[self._index[column]].label
        return label + ("▼" if self.sort_reverse else "▲") if column == self.sort_key else label

    # -- sorting --

    def header_clicked(self, x: int) -> None:
        """A click on a sortable header sorts by it; a second click reverses."""
        keys = [c.key for c in self.COLUMNS]
        column = next((keys[i] for i in reversed(range(len(keys))) if x >= self._x(i)), None)
        if column in self.SORTS:
            if column == self.sort_key:
                self.sort_reverse = not self.sort_reverse
            else:
                self.sort_key, self.sort_reverse = column, self.SORTS[column]
            self._resort()

    def _resort(self) -> None:
        self.order = []  # forces a full repaint in the new order
        self._reshow()
        self.post_message(self.SortChanged())

    def action_cycle_sort(self) -> None:
        keys = list(self.SORTS)
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.sort_reverse = self.SORTS[self.sort_key]
        self._resort()

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._resort()
