"""Repaint only the characters that changed, as curses does.

A widget that renders a few lines of Rich Text keeps what it last showed; on an update it finds,
per line, the span of cells whose text or style changed and refreshes just that region, so the
terminal receives a handful of characters instead of whole lines every second.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.text import Text
from textual.geometry import Region
from textual.widget import Widget


def _styles_per_cell(text: Text) -> list[tuple]:
    styles: list[tuple] = [() for _ in range(len(text.plain))]
    for span in text.spans:
        for i in range(span.start, min(span.end, len(styles))):
            styles[i] += (span.style,)
    return styles


def changed_span(old: Text, new: Text) -> tuple[int, int] | None:
    """First and one-past-last cell that differ between two lines; None if equal. Cells, not
    characters: a CJK name or an emoji before the change takes two cells each.

    One span per line: Textual sends each span from the start of the segment it begins in, so
    several spans on a line would resend shared segments.
    """
    if old.plain == new.plain and old.spans == new.spans and old.style == new.style:
        return None
    a, b = old.plain, new.plain
    length = max(len(a), len(b))
    if old.style != new.style:
        return 0, max(cell_len(a), cell_len(b))
    sa, sb = _styles_per_cell(old), _styles_per_cell(new)

    def same(i: int) -> bool:
        return i < len(a) and i < len(b) and a[i] == b[i] and sa[i] == sb[i]

    start = next((i for i in range(length) if not same(i)), None)
    if start is None:
        return None
    end = next(i for i in range(length, start, -1) if not same(i - 1))
    return min(cell_len(a[:start]), cell_len(b[:start])), max(cell_len(a[:end]), cell_len(b[:end]))


class PartialRefresh:
    """Mixin for a Widget: call `show_lines(lines)`; return `self.shown` from render()."""

    shown: list[Text] | None = None
    _shown_width = -1

    def show_lines(self: Widget, lines: list[Text], width: int) -> None:
        old = self.shown
        self.shown = lines
        if old is None or len(old) != len(lines) or width != self._shown_width:
            self._shown_width = width
            self.refresh(layout=old is None or len(old) != len(lines))
            return
        regions = [Region(span[0], y, span[1] - span[0], 1) for y, (before, after) in enumerate(zip(old, lines))
                   if (span := changed_span(before, after)) is not None]
        if regions:  # one refresh call: each costs Textual more than the line itself
            self.refresh(*regions)
