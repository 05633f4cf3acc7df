"""Textual's compositor updates written into the wanted screen as cells, not as escape sequences.

Textual turns each update into one string of cursor moves and `ESC[…m` attributes around every
segment, and the output layer would parse that string straight back into cells: half the cost of
a frame for nothing. Here the update's segments go into `ScreenDiff` directly, with each Rich style
read once into attributes (cached on the style by Textual, and by `sgr.apply`). The result is the
same wanted screen as feeding Textual's string (a test compares both), except hyperlinks (OSC 8
around text), which are dropped: gpumon draws none.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

from rich.color import ColorSystem
from rich.style import Style
from textual.strip import Strip

from gpumon.tui.wire import sgr
from gpumon.tui.wire.screen import ScreenDiff

try:
    from textual._compositor import ChopsUpdate, LayoutUpdate
except ImportError:  # a Textual without them: guards.py says so, and every update goes the string way
    ChopsUpdate = LayoutUpdate = None
if TYPE_CHECKING:
    from textual._compositor import CompositorUpdate


def drawable(update: object) -> bool:
    """Can `draw` take this update? (anything else goes the string way)"""
    return ChopsUpdate is not None and isinstance(update, (ChopsUpdate, LayoutUpdate))


def draw(diff: ScreenDiff, update: CompositorUpdate, color_system) -> None:
    if isinstance(update, ChopsUpdate):
        _draw_chops(diff, update, color_system)
    elif isinstance(update, LayoutUpdate):
        for y, line in enumerate(update.strips, update.region.y):
            x = update.region.x
            for strip in line:
                diff.put(y, x, _runs(strip, color_system))
                x += strip.cell_length


def _draw_chops(diff: ScreenDiff, update: ChopsUpdate, color_system) -> None:
    """As ChopsUpdate.render_segments: each line's chops within its changed span. Textual writes a
    chop from its left edge even when the change starts further right (a cell in the middle of a
    table row); here the chop is cut at the span's start too, where no wide character straddles it."""
    for y, x1, x2 in update.spans:
        for end, (x, strip) in zip(update.chop_ends[y], update.chops[y].items()):
            if strip is None or x >= x2 or end <= x1:
                continue
            if x2 > x >= x1 and end <= x2:
                diff.put(y, x, _runs(strip, color_system))
            elif _single_width(strip):  # cut by slicing the text: no Strip made for each cut chop
                left = max(x, x1)
                diff.put(y, left, _cut_runs(strip, left - x, min(end, x2) - x, color_system))
            else:
                strip = strip.crop(0, min(end, x2) - x)
                diff.put(y, x, _runs(strip, color_system))


def _single_width(strip: Strip) -> bool:
    return sum(len(text) for text, _, _ in strip) == strip.cell_length


def _runs(strip: Strip, color_system) -> Iterable[tuple[str, sgr.State]]:
    state_of = _state
    for text, style, control in strip:
        if not control:
            yield text, (sgr.DEFAULT if style is None else state_of(style, color_system))


def _cut_runs(strip: Strip, start: int, stop: int, color_system) -> Iterable[tuple[str, sgr.State]]:
    """The runs of cells start..stop of a strip of single-width characters."""
    state_of = _state
    x = 0
    for text, style, control in strip:
        if control:
            continue
        after = x + len(text)
        if after > start:
            yield text[max(0, start - x):stop - x], (sgr.DEFAULT if style is None else state_of(style, color_system))
        if after >= stop:
            return
        x = after


@lru_cache(maxsize=1024)
def _colourless(style: Style) -> sgr.State:
    """NO_COLOR: the style's attributes (bold, reverse, underline) without any colour."""
    return sgr.apply(sgr.DEFAULT, Strip.render_ansi(style.without_color, ColorSystem.TRUECOLOR))


def _state(style: Style, color_system) -> sgr.State:
    if color_system is None:
        return _colourless(style)
    ansi = style._ansi
    if ansi is None:
        ansi = Strip.render_ansi(style, color_system)
    return sgr.apply(sgr.DEFAULT, ansi)
