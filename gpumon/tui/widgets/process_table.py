"""The process table. Rows have stable keys (card:pid) and are patched, not rebuilt: only changed
cells are updated, rows come and go individually, and it is re-sorted only when the order changed,
so the cursor and scroll position survive every sample and a quiet sample writes nothing."""

from __future__ import annotations

import getpass
from dataclasses import dataclass

from rich.text import Text
from textual.binding import Binding
from textual.message import Message
from textual.widgets import DataTable

from gpumon.model import ProcessSample, Snapshot
from gpumon.units import format_bytes

COLUMNS = [("gpu", "GPU"), ("pid", "PID"), ("user", "USER"), ("type", "T"), ("gpu_mem", "GPU MEM"),
           ("sm", "SM%"), ("cpu", "CPU%"), ("rss", "HOST MEM"), ("age", "AGE"), ("command", "COMMAND")]
# Sort keys the `s` key cycles through, with the direction each starts in (True: largest first).
SORTS = {"gpu_mem": True, "sm": True, "cpu": True, "pid": False, "user": False, "age": True}
_NUMERIC = {"gpu", "pid", "gpu_mem", "sm", "cpu", "rss", "age"}


@dataclass(frozen=True, slots=True)
class Row:
    gpu: int
    process: ProcessSample
    age: float | None
    job: str | None = None
    job_id: str | None = None

    @property
    def key(self) -> str:
        return f"{self.gpu}:{self.process.pid}"

    def sort_value(self, sort: str) -> object:
        p = self.process
        return {
            "gpu_mem": p.gpu_memory or 0, "sm": p.sm_util or 0, "cpu": p.cpu_percent or 0.0,
            "pid": p.pid, "user": p.user or "", "age": self.age or 0.0,
        }[sort]

    def matches(self, needle: str) -> bool:
        p = self.process
        hay = " ".join(str(x) for x in (p.pid, p.user, p.command, p.container, self.job, self.job_id) if x is not None)
        return needle.lower() in hay.lower()


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "N/A"
    s = int(max(0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600}h"


def rows_from(snapshot: Snapshot, only_gpu: int | None, needle: str,
              jobs: dict[int, tuple[str, str]] | None = None) -> list[Row]:
    rows = []
    for gpu in snapshot.gpus:
        if only_gpu is not None and gpu.index != only_gpu:
            continue
        for p in gpu.processes:
            age = snapshot.time - p.started if p.started is not None else None
            name, job_id = (jobs or {}).get(p.pid, (None, None))
            row = Row(gpu.index, p, age, name, job_id)
            if not needle or row.matches(needle):
                rows.append(row)
    return rows


class ProcessTable(DataTable):
    COMPONENT_CLASSES = DataTable.COMPONENT_CLASSES | {"process-table--own", "process-table--muted", "process-table--job"}
    BINDINGS = [
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
    ]

    def __init__(self, invisible_reason: str, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, **kwargs)
        self.me = getpass.getuser()
        self.invisible_reason = invisible_reason
        self.sort_key = "gpu_mem"
        self.sort_reverse = SORTS["gpu_mem"]
        self._cells: dict[str, tuple] = {}
        self._order: list[str] = []
        self.rows_by_key: dict[str, Row] = {}

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(self._label(key, label), key=key)

    def _label(self, key: str, label: str) -> Text:
        if key == self.sort_key:
            return Text(label + ("▼" if self.sort_reverse else "▲"), style="bold")
        return Text(label)

    def _relabel(self) -> None:
        for key, label in COLUMNS:
            self.columns[key].label = self._label(key, label)  # type: ignore[index]
        self._order = []  # forces a re-sort
        self.refresh()

    def action_cycle_sort(self) -> None:
        keys = list(SORTS)
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.sort_reverse = SORTS[self.sort_key]
        self._relabel()
        self.post_message(self.SortChanged())

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._relabel()
        self.post_message(self.SortChanged())

    class SortChanged(Message):
        """The sort column or direction changed (the app shows it in the table's title)."""

    @property
    def selected_row(self) -> Row | None:
        if not self.row_count:
            return None
        try:
            key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # noqa: BLE001 - cursor outside an emptied table
            return None
        return self.rows_by_key.get(key)

    def _cells_for(self, row: Row) -> tuple:
        p = row.process
        visible = p.user is not None or p.command is not None
        user = Text(p.user or "?")
        if p.user == self.me:
            user.stylize(self.get_component_rich_style("process-table--own"))
        if not visible:
            command = Text(self.invisible_reason, style=self.get_component_rich_style("process-table--muted"))
        else:
            command = Text()
            if row.job:
                command.append(f"[job {row.job}] ", style=self.get_component_rich_style("process-table--job"))
            if p.container:
                command.append(f"[{p.container}] ", style=self.get_component_rich_style("process-table--muted"))
            command.append(p.command or "?")
        return (
            Text(str(row.gpu), justify="right"),
            Text(str(p.pid), justify="right"),
            user,
            Text("C" if p.type == "compute" else "G"),
            Text(format_bytes(p.gpu_memory), justify="right"),
            Text("N/A" if p.sm_util is None else str(p.sm_util), justify="right"),
            Text("N/A" if p.cpu_percent is None else f"{p.cpu_percent:.0f}", justify="right"),
            Text(format_bytes(p.rss), justify="right"),
            Text(format_age(row.age), justify="right"),
            command,
        )

    def show(self, rows: list[Row]) -> None:
        """Patch the table to show exactly `rows`, in the current sort order."""
        wanted = {row.key: row for row in rows}
        cursor_key = self.selected_row.key if self.selected_row else None
        with self.app.batch_update():
            for key in [k for k in self._cells if k not in wanted]:
                self.remove_row(key)
                del self._cells[key]
            for key, row in wanted.items():
                cells = self._cells_for(row)
                old = self._cells.get(key)
                if old is None:
                    self.add_row(*cells, key=key)
                elif old != cells:
                    for (column, _), new, before in zip(COLUMNS, cells, old):
                        if new != before:
                            self.update_cell(key, column, new)
                self._cells[key] = cells
            self.rows_by_key = wanted
            order = [r.key for r in sorted(rows, key=lambda r: (r.sort_value(self.sort_key), r.key), reverse=self.sort_reverse)]
            if order != self._order:
                rank = {key: i for i, key in enumerate(order)}
                self.sort("gpu", "pid", key=lambda cells: rank[f"{cells[0].plain}:{cells[1].plain}"])
                self._order = order
                if cursor_key in rank:
                    self.move_cursor(row=rank[cursor_key], scroll=False)
