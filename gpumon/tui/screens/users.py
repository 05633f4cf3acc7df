"""`u`: who is using the cards — one row per user, with its Slurm jobs, pods and containers under
it: cards held, memory, SM %, power share, energy, how long held, how long idle — and a line at the
top naming the holders that hold cards idle.

The app keeps one HolderTracker fed with every reading from its start (owners/holders.py), so
idle time counts before the view is opened; each time the app posts it a reading while it is
shown (`SnapshotArrived` from this machine, `HostsReported` from a fleet: tui/messages.py), the
view asks `source()` for the holders of the latest one and repaints only what changed.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.events import ScreenResume
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from gpumon.model import Snapshot
from gpumon.owners.holders import Holder, summary
from gpumon.sanitize import printable
from gpumon.sharing.view import SharingNow, reservations_text
from gpumon.tui.messages import HostsReported, SnapshotArrived
from gpumon.tui.widgets.changed_cells import CachedStyles, PartialRefresh
from gpumon.tui.widgets.filter_box import FilterBox
from gpumon.tui.widgets.holder_table import HolderTable
from gpumon.tui.widgets.line_table import TableFrame
from gpumon.tui.wire.compositor import use_lean_compositor


class UsersLine(CachedStyles, PartialRefresh, Widget):
    STYLE_PREFIX = "users-line--"
    COMPONENT_CLASSES = {"users-line--idle", "users-line--muted"}

    def show(self, idle: str, rest: str) -> None:
        text = Text(" ")
        text.append(idle, style=self._style("idle"))
        text.append(rest, style=self._style("muted"))
        width = self.size.width
        if width:
            text.truncate(width, overflow="ellipsis")
            self.show_lines([text], width)  # usually the few digits of an idle time

    def render(self) -> Text:
        return self.shown[0] if self.shown else Text(" reading…")


class UsersScreen(Screen):
    BINDINGS = [
        Binding("escape", "back", "Back"),
        Binding("u,q", "close", "Back", show=False),
        Binding("slash", "filter", "Filter"),
    ]

    def __init__(self, source: Callable[[], tuple[Holder, ...]], hosts: bool = False, title: str = "Users",
                 reservations: SharingNow | None = None) -> None:
        """`source`: the holders of the latest reading; `hosts`: a HOST column (the fleet);
        `reservations`: this machine's (gpumon/sharing), listed under the idle line."""
        super().__init__()
        self.reservations = reservations
        self.snapshot: Snapshot | None = None
        self._reserved_lines: list[str] = []
        use_lean_compositor(self)  # redrawn every second: only what is drawn is rendered
        self.source = source
        self.hosts = hosts
        self.title_text = title
        self.table = HolderTable(hosts=hosts, id="holders")
        self._frame_title = ""

    def compose(self) -> ComposeResult:
        saved = self.app.preferences.saved  # the sort chosen last time (tui/preferences.py)
        if saved.users_sort in HolderTable.SORTS:
            self.table.sort_key, self.table.sort_reverse = saved.users_sort, bool(saved.users_sort_reverse)
        self.line = UsersLine(id="users-line")
        yield self.line
        self.reserved = Static("", id="users-reserved")
        self.reserved.display = False
        yield self.reserved
        with TableFrame(id="holders-frame") as self.frame:
            self.frame.border_subtitle = "s sort · / filter · Esc back"
            yield self.table
        yield FilterBox("filter: user, job, pod, container" + (", host" if self.hosts else "") + " (Esc clears)",
                        self.table, id="users-filter")
        yield Footer()

    def on_mount(self) -> None:
        self.table.focus()
        self.call_after_refresh(self.show_latest)

    def on_screen_resume(self, event: ScreenResume) -> None:
        self.show_latest()

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        self.snapshot = message.snapshot  # this machine's: whose processes are on cards others hold
        self._reading_arrived()

    def on_hosts_reported(self, message: HostsReported) -> None:
        self._reading_arrived()

    def _reading_arrived(self) -> None:
        if self.app.screen is self:  # hidden: drawn when shown again (on_screen_resume)
            self.show_latest()

    def show_latest(self) -> None:
        """The holders of the latest reading, on screen."""
        if not self.is_attached or not self.table.is_attached:
            return
        holders = self.source()
        self.table.show(holders)
        self.line.show(*summary(holders, self.hosts))
        if self.reservations is not None:
            lines = reservations_text(self.reservations.reservations())
            if self.snapshot is not None:
                lines += [f"Without a claim: {u.words()}" for u in self.reservations.without_claim(self.snapshot)]
            if lines != self._reserved_lines:  # repainted only when they change
                self._reserved_lines = lines
                self.reserved.display = bool(lines)
                self.reserved.update(Text("\n".join(f" {line}" for line in lines)))  # notes as typed: never markup
        self._show_title()

    def _show_title(self) -> None:
        table = self.table
        title = f"{self.title_text} · {table.row_count} rows"
        if table.filter_text:
            title += f" · filter “{table.filter_text}”"
        if title != self._frame_title:  # setting it repaints the whole frame
            self._frame_title = title
            self.frame.border_title = Text(printable(title))  # a host's name, what was typed: never markup

    # -- keys --

    def action_close(self) -> None:
        self.app.pop_screen()

    def action_back(self) -> None:
        """Esc: clears a filter first, then goes back."""
        if not self.query_one("#users-filter", FilterBox).clear():
            self.action_close()

    def action_filter(self) -> None:
        self.query_one("#users-filter", FilterBox).open()

    def on_filter_box_filtered(self, event: FilterBox.Filtered) -> None:
        self.table.set_filter(event.text)
        self._show_title()

    def on_holder_table_sort_changed(self, message: HolderTable.SortChanged) -> None:
        self.app.preferences.change(users_sort=self.table.sort_key, users_sort_reverse=self.table.sort_reverse)
        self._show_title()
