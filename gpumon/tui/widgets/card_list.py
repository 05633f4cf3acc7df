"""The focusable list of card panels: it tracks the selected card (↑/↓, j/k, a click)."""

from __future__ import annotations

from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message
from textual.widgets import Static

from gpumon.tui.widgets.gpu_panel import GpuPanel


class CardList(VerticalScroll, can_focus=True):
    """The cards, one panel each; ↑/↓ or j/k (or a click) select one."""

    BINDINGS = [
        Binding("up,k", "move(-1)", "Prev card", show=False),
        Binding("down,j", "move(1)", "Next card", show=False),
        Binding("home", "select_position(0)", show=False),
        Binding("end", "select_position(-1)", show=False),
    ]

    class Selected(Message):
        def __init__(self, position: int) -> None:
            super().__init__()
            self.position = position

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.selected = 0
        self.panels: list[GpuPanel] = []

    def set_count(self, count: int, compact: bool) -> None:
        """Make as many panels as cards (cards rarely come and go)."""
        placeholder = self.query("#no-cards")
        if count == 0 and not placeholder:
            self.mount(Static("No NVIDIA GPUs: the driver reports no cards.", id="no-cards"))
        elif count and placeholder:
            placeholder.remove()
        while len(self.panels) < count:
            panel = GpuPanel(len(self.panels))
            self.panels.append(panel)
            self.mount(panel)
        while len(self.panels) > count:
            self.panels.pop().remove()
        for panel in self.panels:
            panel.set_class(compact, "-compact")
        self._mark_selected()

    def _mark_selected(self) -> None:
        self.selected = min(self.selected, max(0, len(self.panels) - 1))
        for panel in self.panels:
            panel.set_selected(panel.position == self.selected)

    def select(self, position: int) -> None:
        if not self.panels:
            return
        self.selected = position % len(self.panels)
        self._mark_selected()
        self.panels[self.selected].scroll_visible(animate=False)
        self.post_message(self.Selected(self.selected))

    def action_move(self, delta: int) -> None:
        if self.panels:
            self.select(max(0, min(len(self.panels) - 1, self.selected + delta)))

    def action_select_position(self, position: int) -> None:
        self.select(position if position >= 0 else len(self.panels) - 1)

    def on_gpu_panel_clicked(self, message: GpuPanel.Clicked) -> None:
        self.focus()
        self.select(message.index)
