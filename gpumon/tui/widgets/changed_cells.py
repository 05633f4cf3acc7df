"""Repaint only the characters that changed, as curses does.

A widget that renders a few lines of Rich Text keeps what it last showed; on an update it finds,
per line, the span of cells whose text or style changed and refreshes just that region, so the
terminal receives a handful of characters instead of whole lines every second.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Console
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget


def changed_span(old: Text, new: Text) -> tuple[int, int] | None:
    """First and one-past-last cell that may differ between two lines; None if equal. Cells, not
    characters: a CJK name or an emoji before the change takes two cells each.

    From the characters that differ and the style spans that are in one line but not the other: a
    span that moved covers both places. One span per line: Textual renders the whole line anyway,
    and the output layer sends only the cells that really changed.
    """
    a, b = old.plain, new.plain
    if old.style != new.style:
        return (0, max(cell_len(a), cell_len(b))) if a or b else None
    starts, ends = [], []
    if a != b:
        shorter = min(len(a), len(b))
        starts.append(next((i for i in range(shorter) if a[i] != b[i]), shorter))
        if len(a) == len(b):
            ends.append(next(i for i in range(len(a), 0, -1) if a[i - 1] != b[i - 1]))
        else:
            ends.append(max(len(a), len(b)))
    if old.spans != new.spans:
        for span in set(old.spans).symmetric_difference(new.spans):
            if span.start < span.end:
                starts.append(span.start)
                ends.append(span.end)
    if not starts:
        return None
    start, end = min(starts), max(ends)
    return min(cell_len(a[:start]), cell_len(b[:start])), max(cell_len(a[:end]), cell_len(b[:end]))


def line_strip(line: Text, width: int, base: Style, console: Console) -> Strip:
    """One line of Rich Text as a Strip over `base`, `width` cells wide."""
    return Strip(line_segments(line, width, base, console), width)


def line_segments(line: Text, width: int, base: Style, console: Console) -> list[Segment]:
    """One line of Rich Text as segments over `base`, padded or cut to `width` cells. A line built by
    appending (styled pieces one after another, texts appended into texts, as the panels are) is
    cut straight from its spans: Rich's general renderer, which re-combines the stack of styles at
    every span boundary, was most of what a panel cost each sample."""
    own = _combined(base, line.style if isinstance(line.style, Style) else console.get_style(line.style))
    segments = _nested_segments(line, own, console)
    if segments is None:  # styles that overlap without one containing the other (stylize): Rich's way
        segments = list(Segment.apply_style(line.render(console, end=""), own))
    return Segment.adjust_line_length(segments, width, base)


_COMBINED: dict[tuple[Style, Style], Style] = {}


def _combined(outer: Style, inner: Style) -> Style:
    """outer + inner, remembered: the same few theme styles are combined for every span of every line."""
    style = _COMBINED.get((outer, inner))
    if style is None:
        if len(_COMBINED) > 4096:  # styles of themes no longer in use
            _COMBINED.clear()
        style = _COMBINED[outer, inner] = outer + inner
    return style


def _nested_segments(line: Text, own: Style, console: Console) -> list[Segment] | None:
    """Segments for spans that nest (each one inside or after the ones before it); None otherwise.
    A stack holds the open spans' ends and combined styles, innermost last."""
    plain = line.plain
    segments: list[Segment] = []
    stack: list[tuple[int, Style]] = [(len(plain), own)]
    at = 0
    for start, end, style in line.spans:
        end = min(end, len(plain))
        if start >= end:
            continue
        while stack[-1][0] <= start:  # close the spans that end before this one starts
            closing, closing_style = stack.pop()
            if closing > at:
                segments.append(Segment(plain[at:closing], closing_style))
                at = closing
        outer_end, outer_style = stack[-1]
        if end > outer_end or start < at:  # straddles an open span's end, or out of order: not nested
            return None
        if start > at:
            segments.append(Segment(plain[at:start], outer_style))
            at = start
        stack.append((end, _combined(outer_style, style if isinstance(style, Style) else console.get_style(style))))
    while stack:
        closing, closing_style = stack.pop()
        if closing > at:
            segments.append(Segment(plain[at:closing], closing_style))
            at = closing
    return segments


class PartialRefresh:
    """Mixin for a Widget: call `show_lines(lines)`; return `self.shown` from render()."""

    TEXT_X = 0  # the column the lines start at, where the widget draws a margin of its own
    shown: list[Text] | None = None
    _shown_width = -1

    def show_lines(self: Widget, lines: list[Text], width: int) -> None:
        old = self.shown
        self.shown = lines
        if old is None or len(old) != len(lines) or width != self._shown_width:
            self._shown_width = width
            self.refresh(layout=old is None or len(old) != len(lines))
            return
        x = self.TEXT_X
        regions = [Region(x + span[0], y, span[1] - span[0], 1) for y, (before, after) in enumerate(zip(old, lines))
                   if (span := changed_span(before, after)) is not None]
        if regions:  # one refresh call: each costs Textual more than the line itself
            self.refresh(*regions)


class CachedStyles:
    """Mixin for a Widget: `_style(name)` is the component style STYLE_PREFIX + name, read once until
    the CSS changes (a new theme, a class toggled). Textual drops its own cache of them at every
    refresh, and the lines are built from them every sample."""

    STYLE_PREFIX = ""
    _cached_styles: dict[str, Style] | None = None

    def _style(self: Widget, name: str) -> Style:
        if self._cached_styles is None:
            self._cached_styles = {}
        style = self._cached_styles.get(name)
        if style is None:
            style = self._cached_styles[name] = self.get_component_rich_style(self.STYLE_PREFIX + name)
        return style

    def notify_style_update(self: Widget) -> None:
        self._cached_styles = None
        super().notify_style_update()

