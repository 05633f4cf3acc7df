"""A partial update that renders only what will be drawn.

For a partial update Textual renders every widget that overlaps the box around all changed regions
and cuts each changed line of each of them at every widget edge, though only the frontmost piece
over a changed span is ever drawn. Behind the process table's rows lie its frame and the screen;
behind the card panels, their list, the row that holds them and the screen: each second those were
rendered and cut up for nothing. `LeanCompositor` goes front to back, as Textual paints, and
renders a widget only over the lines where it is the first to cover a piece of a changed span.
The update is the same (a test compares the two on the running app after every frame). Where
this Textual is not the one it was written for (guards.py), screens keep Textual's compositor.
"""

from __future__ import annotations

from textual.geometry import Region
from textual.screen import Screen
from textual.strip import Strip

from gpumon.tui.wire.guards import usable

try:
    from textual._compositor import ChopsUpdate, Compositor
except ImportError:  # a Textual without it: guards.py says so, and the class is never used
    ChopsUpdate, Compositor = None, object


class LeanCompositor(Compositor):
    def render_partial_update(self) -> ChopsUpdate | None:
        screen = self.size.region
        changed = [region for region in map(screen.intersection, self._dirty_regions) if region]
        self._dirty_regions.clear()
        if not changed:
            return None
        spans = list(self._regions_to_spans(changed))
        cuts = self.cuts
        chops: list[dict[int, Strip | None]] = [dict.fromkeys(cut_set[:-1]) for cut_set in cuts]
        # Per changed line, the pieces (by the cut they start at) that a changed span overlaps.
        wanted: dict[int, set[int]] = {}
        for y, x1, x2 in spans:
            line_cuts = cuts[y]
            wanted.setdefault(y, set()).update(
                start for start, end in zip(line_cuts, line_cuts[1:]) if start < x2 and end > x1)
        for widget, (region, clip) in self.visible_widgets.items():  # front to back
            if not wanted:
                break
            visible = region.intersection(clip)
            x1, x2 = visible.column_span
            mine = {}
            for y in visible.line_range:
                pieces = wanted.get(y)
                if pieces:
                    starts = {start for start in pieces if x1 <= start < x2}
                    if starts:
                        mine[y] = starts
            if not mine:
                continue
            top, bottom = min(mine), max(mine) + 1
            strips = widget.render_lines(Region(x1 - region.x, top - region.y, x2 - x1, bottom - top))
            for y, starts in mine.items():
                line_cuts = [cut for cut in cuts[y] if x1 <= cut <= x2]
                line_chops = chops[y]
                for start, piece in zip(line_cuts, strips[y - top].divide([cut - x1 for cut in line_cuts[1:]])):
                    if start in starts:
                        line_chops[start] = piece
                wanted[y] -= starts
                if not wanted[y]:
                    del wanted[y]
        return ChopsUpdate(chops, spans, [cut_set[1:] for cut_set in cuts])


def use_lean_compositor(screen: Screen) -> None:
    """Call from the screen's __init__, before it is mounted."""
    if usable("lean compositor", screen, "_compositor._dirty_regions", "_compositor.size"):
        screen._compositor = LeanCompositor()
