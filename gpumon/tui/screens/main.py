"""The main screen: status line, card panels with history charts beside them, the process table.

Each reading reaches it as a message (`SnapshotArrived`, tui/messages.py: the newest of those
waiting) and it patches its widgets; a process screen it opened is handed the reading on the
same way while it is the one shown. Behind an overlay (help, topology, alerts, the run dialog,
jobs) it stays visible and keeps updating, but every few seconds only: Textual repaints the
whole screen for any change behind a modal, so a per-sample update would cost a full frame each
time. It catches up at once when it is shown again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.events import Resize, ScreenResume
from textual.screen import Screen
from textual.widgets import Footer

from gpumon.cards.cuda_order import cuda_ordinals
from gpumon.cards.process_history import ProcessHistory
from gpumon.cards.sampler import History
from gpumon.cards.topology import unknown_links
from gpumon.jobs import records as jobs
from gpumon.jobs.placement import free_enough
from gpumon.model import GpuSample, Snapshot
from gpumon.owners.containers import invisible_reason
from gpumon.sharing.folder import SharingSettings
from gpumon.sharing.view import SharingNow, UseWithoutClaim, card_words
from gpumon.tui.literal_text import plain
from gpumon.tui.messages import SnapshotArrived
from gpumon.tui.preferences import Preferences
from gpumon.tui.screens.card_actions import CardActions
from gpumon.tui.widgets.card_list import CardList
from gpumon.tui.widgets.filter_box import FilterBox
from gpumon.tui.widgets.gpu_panel import has_verdict
from gpumon.tui.widgets.history_chart import WINDOWS, HistoryChart
from gpumon.tui.widgets.line_table import TableFrame
from gpumon.tui.widgets.process_table import ProcessTable, rows_from
from gpumon.tui.widgets.status_bar import StatusBar
from gpumon.tui.wire.compositor import use_lean_compositor

CHART_METRICS = ("util", "mem", "temp", "power")
WIDE = 140  # columns from which history charts sit beside the cards
CHART_MIN_HEIGHT = 8
FULL_PANEL_LINES = 4  # a full card panel: title, bars, details, blank line
JOB_SCAN_S = 3.0  # how often the process table learns which pids belong to gpumon jobs
BEHIND_OVERLAY_S = 5.0  # how often the dashboard updates while an overlay covers part of it


class MainScreen(CardActions, Screen):
    local_sharing = True  # this machine's reservations on its cards (a fleet host's view: False)
    BINDINGS = [
        # a, s and / are on the process table's frame: the footer keeps its room for the actions
        # (all of them fit at 120 columns, a fleet host's view included; ? lists every key).
        Binding("a", "toggle_scope", "All/one card", show=False),
        Binding("enter", "open_process", "Process"),
        Binding("slash", "filter", "Filter", show=False),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("x", "signal('terminate')", "Terminate"),
        Binding("X", "signal('kill')", "Kill"),
        Binding("i", "signal('interrupt')", "Interrupt", show=False),
        Binding("e", "environment", "Env"),
        # Where the four above cannot act (demo or recorded processes), this says why instead.
        Binding("x,X,i", "not_real('nothing to signal')", show=False),
        Binding("e", "not_real('no environment to show')", show=False),
        Binding("w", "cycle_window", "Window", show=False),
        Binding("t", "topology", "Topology"),
        Binding("h", "health", "Health", show=False),
        Binding("r", "run", "Run here"),
        Binding("m", "mem_limit", "Mem limit", show=False),
        Binding("J", "jobs", "Jobs"),
        Binding("u", "users", "Users"),
        # The process table's sort from anywhere on the screen (its own s and S win when it has focus),
        # and the function keys htop, nvtop and btop users reach for.
        Binding("s,f6", "sort_processes", show=False),
        Binding("S", "sort_processes(True)", show=False),
        Binding("f3", "filter", show=False),
        Binding("f9", "signal_menu", show=False),
    ]

    def __init__(self, history: History, interval: float, real_pids: bool, readonly: bool,
                 env: Mapping[str, str] | None = None, waiting: str = "starting…",
                 identity: Snapshot | None = None, *, process_history: ProcessHistory,
                 sharing: SharingNow | None = None) -> None:
        """`process_history`: each process's recent past, for its screen (Enter), fed every fresh
        reading by the app that reads them (a reading this screen never draws counts too).
        `sharing`: this machine's reservations as last read (by the app, in a thread)."""
        super().__init__()
        use_lean_compositor(self)  # redrawn every second: only what is drawn is rendered
        self.waiting = waiting  # the status line until the first sample
        self.identity = identity  # the cards' names, shown until the first sample
        self.history = history
        self.interval = interval
        self.real_pids = real_pids
        self.readonly = readonly
        self.env = dict(os.environ if env is None else env)
        self.snapshot: Snapshot | None = None
        self._names_settling = False  # the cards' names drawn, their layout pass not done yet
        self.reservations = sharing or SharingNow(SharingSettings())
        self._unclaimed: tuple[object, dict[tuple[int, int], UseWithoutClaim]] = (None, {})
        self.only_selected = False
        self.filter_text = ""
        self.window = WINDOWS[0]
        self.process_history = process_history
        self.process_screen = None  # the process screen while it is open (screens/process.py)
        self.alerts: Mapping[int, tuple[str, ...]] = {}  # the rules firing, per card, as of the reading shown
        self.job_of_pid: dict[int, tuple[str, str]] = {}  # pid -> (job name, job id)
        self._ordinals_for: tuple | None = None
        self._ordinals: dict[int, str] | None = None
        self._layout_key: tuple | None = None
        self._top_height = 0
        self._applied_at = 0.0  # monotonic time of the last update on screen
        self._frame_title = ""

    def compose(self) -> ComposeResult:
        # Kept as attributes: every sample updates them, and a DOM query each time costs more than the update.
        self.status_bar = StatusBar(self.interval, self.waiting, id="status")
        self.cards = CardList(id="cards")
        self.charts = [HistoryChart(metric, id=f"chart-{metric}") for metric in CHART_METRICS]
        self.table = ProcessTable(invisible_reason(), id="processes")
        self._restore(self.app.preferences.saved)
        self.table_frame = TableFrame(id="process-frame")
        self.table_frame.border_subtitle = "a: all/one card  s: sort  /: filter"
        yield self.status_bar
        with Horizontal(id="top") as self.top:
            yield self.cards
            with Vertical(id="charts") as self.chart_box:  # hidden (CSS) until the layout says there is room
                yield from self.charts
        yield FilterBox("filter processes: pid, user, command, container (Esc clears)", self.table, id="filter")
        with self.table_frame:
            yield self.table
        yield Footer()

    def _restore(self, saved: Preferences) -> None:
        """The choices kept from the last time (tui/preferences.py); values this gpumon does not know are left."""
        table = self.table
        if saved.sort in table.SORTS:
            table.sort_key = saved.sort
            table.sort_reverse = table.SORTS[saved.sort] if saved.sort_reverse is None else saved.sort_reverse
        if saved.window in WINDOWS:
            self.window = saved.window
        if saved.all_cards is not None:
            self.only_selected = not saved.all_cards

    def on_mount(self) -> None:
        if self.identity is not None and self.snapshot is None:
            self._show_identity(self.identity)
        self.query_one(CardList).focus()
        if self.real_pids:
            self.set_interval(JOB_SCAN_S, self._scan_jobs)
            self._scan_jobs()

    def _scan_jobs(self) -> None:
        self.run_worker(self._job_pids, thread=True, exclusive=True, group="jobs")

    def _job_pids(self) -> None:
        """Which running processes belong to gpumon jobs (read off the job records, in a thread)."""
        found = {}
        for job in jobs.list_jobs():
            for proc in job.processes():
                found[proc.pid] = (job.spec.name, job.spec.id)
        self.app.call_from_thread(self._set_job_pids, found)

    def _set_job_pids(self, found: dict[int, tuple[str, str]]) -> None:
        if found != self.job_of_pid:
            self.job_of_pid = found
            if self.snapshot is not None:
                self._update_table()

    # -- data in --

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        if self._names_settling:
            # The cards' names were just drawn (at the start, or again for a resize queued ahead of
            # the first reading) and their layout pass is still waiting: it repaints only what it
            # moves, so a reading drawn ahead of it reached the terminal torn (panels in their
            # names-only height, a status line half "reading the cards…"), and those cells were
            # never sent again. Drawn once that pass is done, in the order they came.
            self.call_after_refresh(self._draw_arrived, message)
        else:
            self._draw_arrived(message)

    def _draw_arrived(self, message: SnapshotArrived) -> None:
        self.alerts = message.alerts
        self.show_snapshot(message.snapshot)

    def show_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        if self.process_screen is not None and self.app.screen is self.process_screen:
            self.process_screen.post_message(SnapshotArrived(snapshot, self.alerts))
        elif self.app.screen is self:
            self._apply()
        elif self.is_current and time.monotonic() - self._applied_at >= BEHIND_OVERLAY_S:
            self._apply()  # visible behind an overlay

    def _show_identity(self, identity: Snapshot) -> None:
        """The cards by name, before their first sample: the first frame is never empty."""
        with self.app.batch_update():
            self._layout(len(identity.gpus))
            self.query_one(StatusBar).show_identity(identity)
            for panel, gpu in zip(self.query_one(CardList).panels, identity.gpus):
                panel.show_identity(gpu)
            self._fit_cards()
        self._names_settling = True
        self.call_after_refresh(self._names_settled)

    def _names_settled(self) -> None:
        self._names_settling = False

    def on_screen_resume(self, event: ScreenResume) -> None:
        if self.snapshot is not None:
            self._apply()

    def on_resize(self, event: Resize) -> None:
        if self.snapshot is not None:
            self._apply()
        elif self.identity is not None:
            self._show_identity(self.identity)

    @property
    def selected_gpu(self):
        if not self.snapshot or not self.snapshot.gpus:
            return None
        cards = self.cards
        return self.snapshot.gpus[min(cards.selected, len(self.snapshot.gpus) - 1)]

    def _ordinals_of(self, snapshot: Snapshot) -> dict[int, str] | None:
        identity = tuple((g.index, g.uuid, g.pci_bus_id, g.name) for g in snapshot.gpus)
        if identity != self._ordinals_for:
            self._ordinals_for = identity
            self._ordinals = cuda_ordinals(snapshot.gpus, self.env)
        return self._ordinals

    def _apply(self) -> None:
        snap = self.snapshot
        assert snap is not None
        if not self.is_attached or not self.children or not self.status_bar.is_attached:  # the app is closing
            return
        self._applied_at = time.monotonic()
        with self.app.batch_update():
            self._layout(len(snap.gpus))
            firing = sum(len(a) for a in self.alerts.values())
            self.status_bar.show(snap, alerts=firing, extra=self.status_extra())
            cards = self.cards
            ordinals = self._ordinals_of(snap)
            xids = self.app.recent_xids
            slot = any(has_verdict(gpu) for gpu in snap.gpus)  # compact rows keep room for WARN/FAIL
            unclaimed = self.without_claim(snap)
            shared = [self.shared_words(gpu, [u for u in unclaimed.values() if u.gpu == gpu.index])
                      for gpu in snap.gpus]  # who claims or reserved each card, and who is on it anyway
            share_slot = any(full for full, _ in shared)
            for panel, gpu, words in zip(cards.panels, snap.gpus, shared):
                panel.show(gpu, snap.stale, ordinals.get(gpu.index) if ordinals else None,
                           self.alerts.get(gpu.index, ()), xids.texts(gpu.index, snap.time), slot, words, share_slot)
            self._fit_cards()
            self._update_charts()
            self._update_table()

    def shared_words(self, gpu: GpuSample, unclaimed: Sequence[UseWithoutClaim] = ()) -> tuple[str, str]:
        """Who claims or reserved the card (this machine's place, as last read in a thread), and
        the processes on it without a claim."""
        full, short = card_words(self.reservations.card(gpu)) if self.local_sharing else ("", "")
        if not short and free_enough(gpu) is None:  # free as select would give it, in the same column
            short = "free"
        if unclaimed:
            full += "; without a claim: " + ", ".join(u.words().split(" on GPU ")[0] for u in unclaimed)
            short = f"!{len(unclaimed)} " + short
        return full, short

    def without_claim(self, snap: Snapshot) -> dict[tuple[int, int], UseWithoutClaim]:
        """This machine's processes on cards others claim or reserved (none for a fleet host)."""
        if not self.local_sharing:
            return {}
        # The panels and the process table ask for one reading: worked out once per reading and read of the place.
        key = (id(snap), id(self.reservations.latest))
        if self._unclaimed[0] != key:
            self._unclaimed = (key, {(u.gpu, u.pid): u for u in self.reservations.without_claim(snap)})
        return self._unclaimed[1]

    def status_extra(self) -> str:
        """Said at the end of the status line (a fleet host's view says how the host is doing)."""
        return self.app.status_note()

    def _layout(self, count: int) -> None:
        """Compact or full panels, chart visibility and heights, from the size and card count."""
        width, height = self.size
        key = (count, width, height)
        if key == self._layout_key:
            return
        self._layout_key = key
        room = max(3, height - 2)  # less status line and footer
        compact = count == 0 or FULL_PANEL_LINES * count + 2 > 0.6 * room
        self.cards.set_count(count, compact)
        self.chart_box.display = width >= WIDE and not compact

    def _fit_cards(self) -> None:
        """Give the cards the lines their panels need, up to a share of the screen."""
        cards = self.cards
        room = max(3, self.size.height - 2)
        if not cards.panels or cards.panels[0].compact:
            needed, cap = len(cards.panels) + 2, int(room * 0.5)
        else:
            width = max(20, cards.size.width - 4 if cards.size.width else self.size.width // 2)
            # Lines of each panel, a blank line between panels, and the border.
            needed = sum(len(p.shown if p.shown is not None else p.lines(width)) + 1 for p in cards.panels) + 1
            cap = int(room * 0.6)
            if self.chart_box.display:  # tall screens: room for all four charts
                needed = max(needed, len(CHART_METRICS) * CHART_MIN_HEIGHT + 2)
        top = max(3, min(needed, cap))
        if top != self._top_height:  # setting a style triggers a layout pass: only on change
            self._top_height = top
            self.top.styles.height = top
        fitting = max(1, top // CHART_MIN_HEIGHT)
        for i, chart in enumerate(self.charts):
            chart.display = i < fitting

    def _update_charts(self) -> None:
        if not self.chart_box.display:
            return
        gpu = self.selected_gpu
        if gpu is None:
            return
        for chart in self.charts:
            if chart.display:
                _, values = self.history.series(gpu.key, chart.metric, self.window)
                chart.show(values, max(2, int(self.window / self.interval)), self.window, f"GPU {gpu.index}")

    def _update_table(self) -> None:
        table = self.table
        gpu = self.selected_gpu
        only = gpu.index if self.only_selected and gpu is not None else None
        rows = rows_from(self.snapshot, only, self.filter_text, self.job_of_pid, self.without_claim(self.snapshot))
        table.show(rows)
        scope = f"GPU {only}" if only is not None else "all cards"
        title = f"Processes · {scope} · {len(rows)}"
        if self.filter_text:  # typed, or a job's id from its host (`p` in the jobs list): not markup
            title += f" · filter “{self.filter_text}”"
        if self._frame_title != title:  # setting it repaints the whole frame
            self._frame_title = title
            self.table_frame.border_title = plain(title)

    # -- selection and keys --

    def on_card_list_selected(self, message: CardList.Selected) -> None:
        if self.snapshot is not None:
            self._apply()

    def on_process_table_sort_changed(self, message: ProcessTable.SortChanged) -> None:
        self.app.preferences.change(sort=self.table.sort_key, sort_reverse=self.table.sort_reverse)
        if self.snapshot is not None:
            self._update_table()

    def action_toggle_scope(self) -> None:
        self.only_selected = not self.only_selected
        self.app.preferences.change(all_cards=not self.only_selected)
        if self.snapshot is not None:
            self._update_table()

    def action_open_process(self) -> None:
        """Enter: the selected process on a screen of its own; back (Esc) to this one as it was."""
        row = self._selected_process()
        if row is None:
            return
        from gpumon.tui.screens.process import ProcessScreen  # imported when first used: not at start

        def closed(_: None) -> None:
            self.process_screen = None

        self.process_screen = ProcessScreen(self, row)
        self.app.push_screen(self.process_screen, closed)

    def action_cycle_window(self) -> None:
        self.window = WINDOWS[(WINDOWS.index(self.window) + 1) % len(WINDOWS)]
        self.app.preferences.change(window=self.window)
        self.notify(f"charts show the last {self.window // 60} min", timeout=2)
        if self.snapshot is not None:
            self._update_charts()

    def action_topology(self) -> None:
        """Open the view at once with what the snapshot knows; links fill in as each card answers."""
        from gpumon.tui.screens.topology import TopologyScreen  # on first use: a start does not load it

        gpu = self.selected_gpu
        gpus = self.snapshot.gpus if self.snapshot else ()
        screen = TopologyScreen(unknown_links(gpus), gpu.index if gpu else 0, reading=True)
        self.app.push_screen(screen)
        self.run_worker(self._read_topology(screen), group="topology")

    async def _read_topology(self, screen) -> None:
        def progress(topo) -> None:  # in the sampler's reading thread
            try:
                self.app.call_from_thread(screen.show_topology, topo, True)
            except RuntimeError:  # the app is closing
                pass

        topo = await self.app.sampler.topology(progress)
        screen.show_topology(topo, False)

    def action_health(self) -> None:
        """The selected card's verdict, reasons and actions, and every health counter."""
        from gpumon.tui.screens.health import HealthScreen  # on first use: a start does not load it

        gpu = self.selected_gpu
        if gpu is not None:
            self.app.push_screen(HealthScreen(gpu))

    def action_users(self) -> None:
        """Who holds the cards: users, jobs, pods, containers, and who holds them idle."""
        self.app.open_users(getattr(self, "host", None))

    def action_sort_processes(self, reverse: bool = False) -> None:
        table = self.query_one(ProcessTable)
        table.action_reverse_sort() if reverse else table.action_cycle_sort()

    def action_filter(self) -> None:
        self.query_one("#filter", FilterBox).open()

    def action_clear_filter(self) -> None:
        if not self.query_one("#filter", FilterBox).clear():
            return
        self.filter_text = ""
        if self.snapshot is not None:
            self._update_table()

    def on_filter_box_filtered(self, event: FilterBox.Filtered) -> None:
        self.filter_text = event.text
        if self.snapshot is not None:
            self._update_table()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Not offered where they cannot work: read-only mode, or simulated/replayed data.
        if action == "signal":
            return not self.readonly and self.real_pids
        if action == "environment":
            return self.real_pids
        if action == "not_real":
            return not self.real_pids
        if action == "open_process":
            return self.focused is self.table
        if action in ("run", "mem_limit"):
            return not self.readonly and self.app.can_launch
        return True
