"""Enter on a process: the whole of it on one screen (nvitop's process screen) — its command line,
user, owner (job, pod, container, unit), start time, cards, CPU % and resident memory, and charts
of its GPU memory, SM % and CPU % over the chart window (`w`), from the per-process history the
main screen is given (cards/process_history.py). The keys that act on the selected process in
the main screen act on this one, through the main screen itself (so a fleet host's view signals
through its host, and demo or recorded processes say they are not real). Escape or q goes back
to the main screen as it was. What it needs of the main screen is `Opener` below: the main
screen imports this module, never the other way round.

When the process leaves the driver's list (or its pid is now another process's), the screen says
it has exited, keeps its last values and charts, and no longer offers the actions. Everything
about the process came from the driver or /proc, so it is shown as text (tui/literal_text.py), never
as markup.
"""

from __future__ import annotations

import time
from typing import Protocol

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from gpumon.cards.process_history import ProcessHistory, Track, key_of, point_of
from gpumon.model import GpuSample, ProcessSample, Snapshot
from gpumon.tui.literal_text import plain
from gpumon.tui.messages import SnapshotArrived
from gpumon.tui.widgets.history_chart import HistoryChart
from gpumon.tui.widgets.process_table import ProcessTable, Row
from gpumon.units import format_bytes, format_duration, format_time

CHARTS = ("proc_mem", "proc_sm", "proc_cpu")
CHART_METRIC = {"proc_mem": "gpu_memory", "proc_sm": "sm_util", "proc_cpu": "cpu_percent"}
MIB = 1024 * 1024
NA = "N/A"


def _started(when: float | None, now: float) -> str:
    if when is None:
        return NA
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))} ({format_duration(now - when)} ago)"


def _owner(process: ProcessSample) -> Text:
    owner = process.owner
    if owner is None:
        return Text(NA)
    if owner.kind == "slurm":
        words = f"Slurm job {owner.id}" + (f" ({owner.name})" if owner.name else "")
    elif owner.kind == "k8s":
        words = f"pod {owner.label} (uid {owner.id})"
    else:
        kinds = {"container": "container", "unit": "systemd unit", "user": "user"}
        words = f"{kinds.get(owner.kind, owner.kind)} {owner.label}"
    return plain(words)


class Opener(Protocol):
    """The screen the process was picked on (the main screen, or a fleet host's view): what it
    shows and the actions that reach the process's host."""

    snapshot: Snapshot | None
    process_history: ProcessHistory
    window: int
    interval: float
    readonly: bool
    real_pids: bool
    table: ProcessTable

    def card_label(self, gpu: GpuSample) -> str: ...
    def signal_process(self, process: ProcessSample, kind: str) -> None: ...
    def signal_menu_for(self, process: ProcessSample) -> None: ...
    def show_environment(self, process: ProcessSample) -> None: ...
    def say_not_real(self, process: ProcessSample, why: str) -> None: ...
    def action_cycle_window(self) -> None: ...


class ProcessScreen(Screen[None]):
    DEFAULT_CSS = """
    ProcessScreen #process-body { height: auto; max-height: 60%; }
    ProcessScreen #process-facts { height: auto; border: round $primary; padding: 0 1; }
    ProcessScreen #process-charts { height: 1fr; min-height: 6; }
    ProcessScreen #process-charts HistoryChart { width: 1fr; }
    """
    BINDINGS = [
        Binding("escape,q,left", "back", "Back"),
        Binding("x", "signal('terminate')", "Terminate"),
        Binding("X", "signal('kill')", "Kill"),
        Binding("i", "signal('interrupt')", "Interrupt", show=False),
        Binding("f9", "signal_menu", "Signals"),
        Binding("e", "environment", "Env"),
        # What cannot act says why: a process that has exited, a simulated or recorded one.
        Binding("x,X,i,f9,e", "gone", show=False),
        Binding("x,X,i,f9", "not_real('nothing to signal')", show=False),
        Binding("e", "not_real('no environment to show')", show=False),
        Binding("w", "cycle_window", "Window"),
    ]

    def __init__(self, main: Opener, row: Row) -> None:
        super().__init__()
        self.main = main
        self.process = row.process
        self.gpu = row.gpu
        self.job = row.job
        self.key = key_of(row.process)
        self.on_cards: list[tuple[GpuSample, ProcessSample]] = []
        self.gone_at: float | None = None  # when a fresh snapshot no longer listed it
        self.now = main.snapshot.time if main.snapshot is not None else time.time()
        # The main screen's history, or this screen's own points for a process it does not track.
        kept = main.process_history.track(row.process)
        self._own_track = kept is None
        self.track = Track(main.process_history.capacity) if kept is None else kept

    def compose(self) -> ComposeResult:
        self.facts = Static(id="process-facts")
        self.charts = [HistoryChart(name, id=f"chart-{name}") for name in CHARTS]
        with VerticalScroll(id="process-body"):
            yield self.facts
        with Horizontal(id="process-charts"):
            yield from self.charts
        yield Footer()

    def on_mount(self) -> None:
        if self.main.snapshot is not None:
            self.on_cards = self._find(self.main.snapshot)
        self._redraw()

    def _find(self, snapshot: Snapshot) -> list[tuple[GpuSample, ProcessSample]]:
        """The process on each card that lists it (by pid and start time: not a new process with its pid)."""
        return [(gpu, p) for gpu in snapshot.gpus for p in gpu.processes if key_of(p) == self.key]

    # -- data in (from the main screen, each reading it is given while this screen is shown) --

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        snapshot = message.snapshot
        if self.gone_at is not None:
            return
        found = self._find(snapshot)
        if found:
            self.on_cards = found
            self.process = next((p for gpu, p in found if gpu.index == self.gpu), found[0][1])
            self.now = snapshot.time
            if self._own_track:
                self.track.add(snapshot.time, point_of([p for _, p in found]))
        elif not snapshot.stale:  # a stale snapshot is the past again: no news of the process
            self.gone_at = snapshot.time
            self.refresh_bindings()
        self._redraw()

    @property
    def gone(self) -> bool:
        return self.gone_at is not None

    def _redraw(self) -> None:
        if not self.is_attached:
            return
        self.facts.update(self._facts())
        self.facts.border_title = self._title()
        window, interval = self.main.window, max(self.main.interval, 0.95)
        for chart in self.charts:
            times, values = self.track.series(CHART_METRIC[chart.metric], window)
            if chart.metric == "proc_mem":
                values = [None if v is None else v / MIB for v in values]
            chart.show(values, max(2, int(window / interval)), window, "")  # the screen's title names the process

    def _title(self) -> Text:
        p = self.process
        title = Text(f"Process {p.pid}")
        if p.user:
            title.append(" · ")
            title.append_text(plain(p.user))
        if self.gone_at is not None:
            title.append(f" · exited (gone at {format_time(self.gone_at, seconds=True)})",
                         style="bold")
        return title

    def _facts(self) -> Table:
        p = self.process
        table = Table.grid(padding=(0, 1))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(overflow="fold")
        if self.gone_at is not None:
            table.add_row("State", Text("exited: the last values it had are shown; nothing can act on it now",
                                        style="bold"))
        visible = p.user is not None or p.command is not None
        command = plain(p.command) if visible else Text(self.main.table.invisible_reason, style="italic")
        table.add_row("Command", command)
        if self.job:
            table.add_row("gpumon job", plain(self.job))
        table.add_row("User", plain(p.user) if p.user else Text(NA))
        table.add_row("Owner", _owner(p))
        if p.container_pid is not None:
            table.add_row("Pid in container", str(p.container_pid))
        table.add_row("Started", _started(p.started, self.now))
        table.add_row("Type", "compute" if p.type == "compute" else "graphics")
        cards = Text()
        for n, (gpu, on_card) in enumerate(self.on_cards):
            if n:
                cards.append(", ")
            sm = NA if on_card.sm_util is None else f"{on_card.sm_util}%"
            cards.append(f"{self.main.card_label(gpu)}: {format_bytes(on_card.gpu_memory)} GPU memory, SM {sm}")
        table.add_row("Cards", cards)
        table.add_row("CPU", NA if p.cpu_percent is None else f"{p.cpu_percent:.0f}%")
        table.add_row("Host memory", NA if p.rss is None else format_bytes(p.rss))
        return table

    # -- keys: the main screen's actions, on this process --

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        main = self.main
        if action == "gone":
            return self.gone
        if action == "signal":
            return not self.gone and not main.readonly and main.real_pids
        if action == "environment":
            return not self.gone and main.real_pids
        if action == "signal_menu":
            return not self.gone
        if action == "not_real":
            return not main.real_pids
        return True

    def action_back(self) -> None:
        self.dismiss(None)

    def action_signal(self, kind: str) -> None:
        self.main.signal_process(self.process, kind)

    def action_signal_menu(self) -> None:
        self.main.signal_menu_for(self.process)

    def action_environment(self) -> None:
        self.main.show_environment(self.process)

    def action_not_real(self, why: str) -> None:
        self.main.say_not_real(self.process, why)

    def action_gone(self) -> None:
        self.notify(f"process {self.process.pid} has exited: nothing to act on", severity="warning", timeout=3)

    def action_cycle_window(self) -> None:
        self.main.action_cycle_window()
        self._redraw()

