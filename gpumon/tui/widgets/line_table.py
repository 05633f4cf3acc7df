"""A table drawn line by line: a header, then one row per key of `order`, with a cursor.

The process table, the users view's table (both through sortable_table.SortableTable) and the
fleet's host table are this: Textual's DataTable re-renders every visible cell on any change,
which costs a frame's worth of CPU each second on a busy machine. Here only the lines on screen
are drawn (`render_line`), each row's strip is cached by the subclass, and a changed row repaints
its own line alone. Subclasses draw the header and a row (`_header`, `_row_strip`) and may act on
a click on the header (`header_clicked`).
"""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import Vertical
from textual.events import Click, Mount, Resize
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gpumon.tui.widgets.unboxed_lines import draw_unboxed_lines


class LineTable(ScrollView, can_focus=True):
    BINDINGS = [
        Binding("up", "cursor(-1)", show=False),
        Binding("down", "cursor(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "cursor_to(0)", show=False),
        Binding("end", "cursor_to(-1)", show=False),
    ]

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        draw_unboxed_lines(self)
        self.order: list[str] = []  # the rows' keys, top to bottom
        self.cursor = 0
        self._strips: dict[str, tuple[tuple, Strip]] = {}  # a row's drawn line, by key, with what it shows

    # -- drawing: for subclasses --

    def _header(self, width: int) -> Strip:
        raise NotImplementedError

    def _row_strip(self, index: int, width: int) -> Strip:
        raise NotImplementedError

    def header_clicked(self, x: int) -> None:
        """A click on the header, `x` cells from the left of the content."""

    # -- drawing --

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            return self._header(width)
        index = y - 1 + self.scroll_offset.y
        if 0 <= index < len(self.order):
            return self._row_strip(index, width)
        return Strip.blank(width, self.rich_style)

    def _set_virtual_height(self) -> None:
        # As wide as the view (no horizontal scrolling: the last column is cut at the edge).
        size = Size(self.scrollable_content_region.width, len(self.order) + 1)
        if size != self.virtual_size:
            self.virtual_size = size

    def _on_mount(self, event: Mount) -> None:
        self._set_virtual_height()

    def _on_resize(self, event: Resize) -> None:
        self._set_virtual_height()
        self._strips.clear()

    def _refresh_row(self, index: int) -> None:
        """Repaint row `index`, if it is on screen."""
        y = index - self.scroll_offset.y + 1
        if 1 <= y < self.size.height:
            self.refresh(Region(0, y, self.size.width, 1))

    @property
    def row_count(self) -> int:
        return len(self.order)

    # -- the cursor --

    def move_cursor(self, index: int) -> None:
        if not self.order:
            return
        old, self.cursor = self.cursor, max(0, min(index, len(self.order) - 1))
        if old != self.cursor:
            self._refresh_row(old)
            self._refresh_row(self.cursor)
        self._scroll_to_cursor()

    def _scroll_to_cursor(self) -> None:
        top = self.scroll_offset.y
        rows = max(1, self.size.height - 1)
        if self.cursor < top:
            self.scroll_to(y=self.cursor, animate=False)
        elif self.cursor >= top + rows:
            self.scroll_to(y=self.cursor - rows + 1, animate=False)

    def action_cursor(self, delta: int) -> None:
        self.move_cursor(self.cursor + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor + direction * max(1, self.size.height - 2))

    def action_cursor_to(self, index: int) -> None:
        self.move_cursor(index if index >= 0 else len(self.order) - 1)

    def _on_click(self, event: Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:  # on the border
            return
        if offset.y >= 1:
            self.move_cursor(offset.y - 1 + self.scroll_offset.y)
        else:
            self.header_clicked(offset.x)


class TableFrame(Vertical):
    """The border and title around a LineTable. Textual draws a widget's border into every line it
    renders, so on the table itself each changed row would redraw its border too (a tenth of a
    frame's CPU with a busy process list); on the frame the border is drawn once."""

