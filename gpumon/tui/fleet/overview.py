"""The fleet overview: one line per host (state, health, a cell per card, free cards, load, hottest card),
with the fleet's totals on the top line.

The app posts it the hosts the fleet reported, a few times a second (`HostsReported`,
tui/messages.py; fleet/app.py says how often), and it draws them together; a backlog of such
messages collapses into one that names every host. It keeps running totals (O(1) per report: the
host's old contribution out, its new one in) and passes each host to the table, which repaints
that one row. Behind another screen it only remembers which hosts changed, and catches up when
it is shown again (behind a dialog, every few seconds).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import ScreenResume
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from gpumon.fleet import Fleet
from gpumon.model import HOST_STATES, HostStatus
from gpumon.tui.fleet.host_row import LEGEND
from gpumon.tui.fleet.host_table import JUMP_S, SORT_LABELS, SORTS, HostTable
from gpumon.tui.messages import HostsReported
from gpumon.tui.widgets.changed_cells import PartialRefresh
from gpumon.tui.widgets.filter_box import FilterBox
from gpumon.tui.widgets.line_table import TableFrame
from gpumon.tui.wire.compositor import use_lean_compositor
from gpumon.units import format_time

BEHIND_OVERLAY_S = 5.0
# Letters that are commands on this screen; any other letter or digit jumps to a host.
RESERVED = "qorROJu"


class FleetStatusLine(PartialRefresh, Widget):
    COMPONENT_CLASSES = {"fleet-status--muted", "fleet-status--bad", "fleet-status--jump"}

    def show(self, text: Text) -> None:
        if self.size.width:
            self.show_lines([text], self.size.width)  # usually just the clock's digits

    def render(self) -> Text:
        return self.shown[0] if self.shown else Text(" gpumon ", style="bold")


class FleetScreen(Screen):
    BINDINGS = [
        Binding("enter,right", "open_host", "Open host"),
        Binding("slash", "filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("o", "cycle_sort", "Sort"),
        Binding("O", "reverse_sort", "Reverse", show=False),
        Binding("r", "run", "Run on its freest card"),
        Binding("R", "run_anywhere", "Run on the best free card", show=False),
        Binding("J", "jobs", "Jobs"),
        Binding("u", "users", "Users"),
    ]

    def __init__(self, fleet: Fleet, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        use_lean_compositor(self)  # redrawn every second: only what is drawn is rendered
        self.fleet = fleet
        self.clock = clock
        self.states: Counter[str] = Counter()
        # Free and all cards the rows show, and how many of those are a host's last reading (not live):
        # with every host away the rows keep their old values, and so does the header, saying so.
        self.free = self.cards = self.old_cards = 0
        self._counted: dict[str, tuple[str, int, int, int]] = {}
        self._pending: dict[str, HostStatus] = {}
        self._flushed_at = 0.0
        self._jump: tuple[str, bool, float] | None = None
        # Kept, not looked up: every host's every line reaches it (256 hosts: 256 lookups a second).
        self.table = HostTable(self.fleet.names, clock=self.clock, reserved=RESERVED, id="hosts")

    def compose(self) -> ComposeResult:
        saved = self.app.preferences.saved  # the sort chosen last time (tui/preferences.py)
        if saved.hosts_sort in SORTS:
            self.table.sort_key, self.table.sort_reverse = saved.hosts_sort, bool(saved.hosts_sort_reverse)
        yield FleetStatusLine(id="fleet-status")
        with TableFrame(id="host-frame") as frame:
            frame.border_title = f"Hosts · {len(self.fleet.names)}"
            frame.border_subtitle = "Enter open · type a name to jump · / filter · o sort · r run · J jobs · u users"
            yield self.table
        yield FilterBox("filter hosts: name, state, note, health (Esc clears)", self.table, id="fleet-filter")
        yield Static(Text(LEGEND), id="fleet-legend")
        yield Footer()

    def on_mount(self) -> None:
        for status in self.fleet.statuses():
            self._take(status)
        self.set_interval(1.0, self._tick)
        self.table.focus()
        self.call_after_refresh(self._show_status)

    # -- data in --

    def on_hosts_reported(self, message: HostsReported) -> None:
        self._pending.update(message.statuses)
        if self.is_attached and self.app.screen is self:
            self._flush()

    @property
    def undrawn(self) -> int:
        """How many hosts it keeps news of, not drawn yet (while behind another screen)."""
        return len(self._pending)

    def _take(self, status: HostStatus) -> None:
        old = self._counted.get(status.host)
        if old is not None:
            self.states[old[0]] -= 1
            self.free -= old[1]
            self.cards -= old[2]
            self.old_cards -= old[3]
        changed = self.table.update_host(status)
        row = changed[1] if changed else self.table.rows[status.host]
        new = (status.state, row.free or 0, row.total, 0 if row.live else row.total)
        self._counted[status.host] = new
        self.states[new[0]] += 1
        self.free += new[1]
        self.cards += new[2]
        self.old_cards += new[3]

    def _flush(self) -> None:
        pending, self._pending = self._pending, {}
        self._flushed_at = time.monotonic()
        for status in pending.values():
            self._take(status)

    def on_screen_resume(self, event: ScreenResume) -> None:
        if self._pending:
            self._flush()
        self._show_status()

    def _tick(self) -> None:
        if self.app.screen is not self:
            if self._pending and self.is_current and time.monotonic() - self._flushed_at >= BEHIND_OVERLAY_S:
                self._flush()  # visible behind a dialog
            return
        self.table.tick()
        self._show_status()

    def _show_status(self) -> None:
        """What the keys just did first (narrow terminals cut the end), then the fleet's totals."""
        line = self.query_one(FleetStatusLine)
        muted = line.get_component_rich_style("fleet-status--muted")
        table = self.table
        text = Text(" gpumon ", style="bold")
        if self._jump is not None and time.monotonic() - self._jump[2] < JUMP_S + 1:
            prefix, found = self._jump[0], self._jump[1]
            text.append(f"jump “{prefix}”" if found else f"no host starts with “{prefix}”",
                        style=line.get_component_rich_style("fleet-status--jump"))
            text.append("  ·  ")
        if table.filter_text:
            text.append(f"{len(table.order)} match “{table.filter_text}”", style=line.get_component_rich_style(
                "fleet-status--jump"))
            text.append("  ·  ")
        text.append(f"{self.free}/{self.cards} cards free", style="bold")
        if self.old_cards:
            every = self.old_cards == self.cards
            text.append(f" ({'all' if every else self.old_cards} from old readings)",
                        style=line.get_component_rich_style("fleet-status--bad"))
        hosts = len(self.fleet.names)
        text.append(f" on {hosts} host{'s' if hosts != 1 else ''}: ")
        # Retrying is being unreachable still: one word for both keeps the line short.
        counts = dict.fromkeys(state for state in HOST_STATES if state != "reconnecting")
        for state in HOST_STATES:
            key = "unreachable" if state == "reconnecting" else state
            counts[key] = (counts[key] or 0) + self.states[state]
        parts = [f"{n} {state}" for state, n in counts.items() if n]
        for i, part in enumerate(parts):
            bad = not part.endswith(" live")
            text.append(part, style=line.get_component_rich_style("fleet-status--bad") if bad else "")
            text.append(", " if i < len(parts) - 1 else "")
        arrow = "" if table.sort_key == "listed" else " ▼" if table.sort_reverse else " ▲"
        text.append(f"  ·  {SORT_LABELS[table.sort_key]}{arrow}", style=muted)
        text.append(f"  ·  every {self.fleet.interval:g}s  ", style=muted)
        now = self.clock()
        text.append(format_time(now, now=now, seconds=True))  # the present: a clock, never a date
        line.show(text)

    def on_host_table_jumped(self, message: HostTable.Jumped) -> None:
        self._jump = (message.prefix, message.found, time.monotonic())
        self._show_status()

    # -- keys --

    @property
    def selected(self) -> str | None:
        return self.table.selected

    def action_open_host(self) -> None:
        if self.selected is not None:
            self.app.open_host(self.selected)

    def action_cycle_sort(self) -> None:
        table = self.table
        self._sort(SORTS[(SORTS.index(table.sort_key) + 1) % len(SORTS)], False)

    def action_reverse_sort(self) -> None:
        self._sort(self.table.sort_key, not self.table.sort_reverse)

    def _sort(self, key: str, reverse: bool) -> None:
        self.table.set_sort(key, reverse)
        self.app.preferences.change(hosts_sort=key, hosts_sort_reverse=reverse)
        self._show_status()

    def action_filter(self) -> None:
        self.query_one("#fleet-filter", FilterBox).open()

    def action_clear_filter(self) -> None:
        self.query_one("#fleet-filter", FilterBox).clear()

    def on_filter_box_filtered(self, event: FilterBox.Filtered) -> None:
        self.table.set_filter(event.text)
        self._show_status()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("run", "run_anywhere"):
            return not self.app.readonly
        return True

    def action_run(self) -> None:
        if self.selected is not None:
            self.app.run_on_host(self.selected)

    def action_run_anywhere(self) -> None:
        self.app.run_anywhere()

    def action_jobs(self) -> None:
        self.app.open_jobs()

    def action_users(self) -> None:
        self.app.open_users()
