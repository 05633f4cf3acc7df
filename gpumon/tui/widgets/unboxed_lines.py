"""Lines that need no boxing by Textual, for widgets whose `render_line` draws every cell itself.

Textual passes each line a widget renders through its box model (border, padding, outline, tint,
opacity, hatch) and builds a new Strip from it, even where the widget has none of these: about
50 µs a line, as much again as drawing a process-table row, and the new Strip also misses the
colour filter's cache of the old one. The process table, the card panels and the status bar repaint
dozens of lines every second with no box at all; for them the widget's own line is the line.
Should a theme give one of them a border or padding, or a line not fill its width, Textual's
way is taken again; and for the run, where this Textual is not the one it was written for (guards.py).
"""

from __future__ import annotations

from textual.strip import Strip
from textual.widget import Widget

from gpumon.tui.wire.guards import usable

try:
    from textual._styles_cache import StylesCache
except ImportError:  # a Textual without it: guards.py says so, and the class is never used
    StylesCache = object


class UnboxedLinesCache(StylesCache):
    _boxed = True

    def render_widget(self, widget: Widget, crop) -> list[Strip]:
        self._boxed = _boxed(widget)  # once a render, not for every line
        return super().render_widget(widget, crop)

    def render_line(self, styles, y, size, content_size, padding, base_background, background,
                    render_content_line, *rest) -> Strip:
        if not self._boxed:
            line = render_content_line(y)
            if line.cell_length == content_size.width:  # less than the widget's by a scrollbar drawn over it
                return line if content_size.width == size.width else Strip(line, size.width)
        return super().render_line(styles, y, size, content_size, padding, base_background, background,
                                   render_content_line, *rest)


def _boxed(widget: Widget) -> bool:
    """Would Textual change this widget's lines? (The same tests as StylesCache.render_line.)"""
    styles = widget.styles
    return bool(
        any(edge for edge, _ in styles.border) or any(edge for edge, _ in styles.outline) or any(styles.padding)
        or styles.text_opacity != 1.0 or styles.tint.a or widget.opacity != 1.0
        or (styles.has_rule("hatch") and styles.hatch != "none")
    )


def draw_unboxed_lines(widget: Widget) -> None:
    """Call from the widget's __init__."""
    if usable("whole lines", widget, "_styles_cache"):
        widget._styles_cache = UnboxedLinesCache()
