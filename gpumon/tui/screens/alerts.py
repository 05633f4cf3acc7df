"""`!`: the alerts firing now, and the latest events, from the same rules engine as `watch`."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpumon.alerting.rules import AlertEngine, AlertEvent
from gpumon.tui.literal_text import plain
from gpumon.units import format_time


def alerts_table(engine: AlertEngine, log: list[AlertEvent]) -> Table:
    """The rules are the config's and the command line's words: text, not markup."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column()
    if not engine.rules:
        table.add_row(Text("No alert rules.", style="bold"),
                      "Add them with --alert 'temp > 85 for 30s' or `rules = [...]` in the config file.")
        return table
    table.add_row(Text("Firing now", style="bold underline"), "")
    firing = engine.firing()
    for gpu in sorted(firing):
        for rule in firing[gpu]:
            table.add_row(f"GPU {gpu}", plain(rule, style="bold red"))
    if not firing:
        table.add_row("", Text("nothing", style="dim"))
    table.add_row("", "")
    table.add_row(Text("Recent events", style="bold underline"), "")
    for event in reversed(log[-30:]):
        when = format_time(event.time, seconds=True)
        table.add_row(f"{when}  GPU {event.gpu}",
                      plain(f"{event.event.upper():8} {event.rule}  ({event.metric}={event.value:g})"))
    table.add_row("", "")
    table.add_row(Text("Rules", style="bold underline"), "")
    for rule in engine.rules:
        table.add_row("", plain(rule.text))
    return table


class AlertsScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,exclamation_mark", "dismiss", "Close")]

    def __init__(self, engine: AlertEngine, log: list[AlertEvent]) -> None:
        super().__init__()
        self.engine = engine
        self.events = log

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="alerts-body") as body:
            body.border_title = "Alerts"
            body.border_subtitle = "Esc to close"
            yield Static(alerts_table(self.engine, self.events))
