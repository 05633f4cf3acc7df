"""The top line: where we are, which driver, how often, and alerts. (A card that does not answer
says so on its own panel: the trouble is that card's, not the whole driver's.)"""

from __future__ import annotations

from rich.text import Text
from textual.strip import Strip
from textual.widget import Widget

from gpumon.model import Snapshot
from gpumon.tui.widgets.changed_cells import CachedStyles, PartialRefresh, line_strip
from gpumon.tui.widgets.unboxed_lines import draw_unboxed_lines
from gpumon.units import format_time


class StatusBar(CachedStyles, PartialRefresh, Widget):
    STYLE_PREFIX = "status-bar--"
    COMPONENT_CLASSES = {"status-bar--badge", "status-bar--stale", "status-bar--muted", "status-bar--alert"}

    def __init__(self, interval: float, waiting: str = "starting…", **kwargs) -> None:
        super().__init__(**kwargs)
        draw_unboxed_lines(self)
        self.interval = interval
        self.waiting = waiting  # shown until the first sample arrives
        self.snapshot: Snapshot | None = None
        self.alerts = 0
        self.extra = ""
        self._shown: tuple | None = None
        self._identity_only = False  # the snapshot holds names only (see show_identity)

    def show(self, snapshot: Snapshot, alerts: int = 0, extra: str = "") -> None:
        key = (snapshot.host, snapshot.driver_version, int(snapshot.time), snapshot.backend, alerts, extra)
        self.snapshot, self.alerts, self.extra = snapshot, alerts, extra
        self._identity_only = False
        if key != self._shown:  # the clock has one-second resolution: no repaint in between
            self._shown = key
            if self.size.width:
                self.show_lines([self._text()], self.size.width)  # usually just the clock's digits
            else:
                self.refresh()

    def show_identity(self, identity: Snapshot) -> None:
        """Host and driver before the first sample (no clock yet: nothing has been read)."""
        self.snapshot, self.waiting = identity, "reading the cards…"
        self._identity_only = True
        self.refresh()

    def render(self) -> Text:
        if self.shown is not None and self._shown_width == self.size.width:
            return self.shown[0]
        return self._text()

    def render_line(self, y: int) -> Strip:
        """The line straight from its Text: the clock changes every second."""
        width, base = self.size.width, self.visual_style.rich_style
        if y:
            return Strip.blank(width, base)
        return line_strip(self.render(), width, base, self.app.console)

    def _text(self) -> Text:
        snap = self.snapshot
        text = Text(" gpumon ", style="bold")
        if snap is None:
            return text.append(self.waiting, style=self._style("muted"))
        muted = self._style("muted")
        text.append(snap.host, style="bold")
        text.append(f"  driver {snap.driver_version or 'N/A'}  CUDA {snap.cuda_driver_version or 'N/A'}", style=muted)
        text.append(f"  every {self.interval:g}s  ", style=muted)
        if self._identity_only:
            return text.append(self.waiting, style=muted)
        # The latest sample is the screen's present: its clock, never a date.
        text.append(format_time(snap.time, now=snap.time, seconds=True))
        if snap.backend != "nvml":
            text.append("  ")
            text.append(f" {snap.backend.upper()} ", style=self._style("badge"))
        if self.alerts:
            text.append("  ")
            text.append(f" {self.alerts} ALERT{'S' if self.alerts > 1 else ''} ",
                        style=self._style("alert"))
        if self.extra:
            text.append(f"  {self.extra}", style=muted)
        return text
