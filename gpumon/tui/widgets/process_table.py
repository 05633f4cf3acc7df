"""The process table, drawn line by line (Textual's line API) for a monitor that runs all day.

Rows have stable keys (card:pid). On each sample only the cells whose text changed are repainted,
so the terminal receives the few characters that changed, as curses would send them, and a quiet
sample sends nothing. Only visible rows are ever rendered (thousands of processes cost little),
each row's strip is cached, and the cursor and scroll position survive every update.
"""

from __future__ import annotations

import getpass
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.style import Style

from gpumon.model import ProcessSample, Snapshot
from gpumon.tui.widgets.sortable_table import GAP, PLAIN, Cells, Column, SortableTable
from gpumon.units import format_bytes, format_duration

# Widths in cells; only user names and owners may hold wide characters (the command takes what is left).
COLUMNS = (Column("gpu", "GPU", right=True, ascii=True), Column("pid", "PID", right=True, ascii=True),
           Column("user", "USER"), Column("type", "T", ascii=True),
           Column("gpu_mem", "GPU MEM", right=True, ascii=True), Column("sm", "SM%", right=True, ascii=True),
           Column("cpu", "CPU%", right=True, ascii=True), Column("rss", "HOST MEM", right=True, ascii=True),
           Column("age", "AGE", right=True, ascii=True), Column("owner", "OWNER"), Column("command", "COMMAND"))
KEYS = [c.key for c in COLUMNS]
OWNER = KEYS.index("owner")
OWNER_CELLS = 32  # longer owners (pod names) are cut with "…"
MIN_OWNER_CELLS = 10  # "job 4242.0": an owner column narrower than this is left out
MIN_COMMAND_CELLS = 24  # the owner column narrows, then is left out, before the command gets less than this


@dataclass(frozen=True, slots=True)
class Row:
    gpu: int
    process: ProcessSample
    age: float | None
    job: str | None = None
    job_id: str | None = None
    # On a card another user claims or reserved, without a claim of its own: whose, in words.
    unclaimed: str | None = None

    @property
    def key(self) -> str:
        return f"{self.gpu}:{self.process.pid}"

    def sort_value(self, sort: str) -> object:
        return SORT_VALUES[sort](self)

    def matches(self, needle: str) -> bool:
        p = self.process
        owner = (p.owner.label, p.owner.id, p.owner.name) if p.owner is not None else ()
        hay = " ".join(str(x) for x in (p.pid, p.user, p.command, p.container, self.job, self.job_id, *owner)
                       if x is not None)
        return needle.lower() in hay.lower()


SORT_VALUES = {
    "gpu_mem": lambda r: r.process.gpu_memory or 0, "sm": lambda r: r.process.sm_util or 0,
    "cpu": lambda r: r.process.cpu_percent or 0.0, "pid": lambda r: r.process.pid,
    "user": lambda r: r.process.user or "", "age": lambda r: r.age or 0.0,
    "owner": lambda r: r.process.owner.label if r.process.owner is not None else "",
}


def _pid_text(p: ProcessSample) -> str:
    """The host's pid, and in parentheses the one the process has in its container."""
    return str(p.pid) if p.container_pid is None else f"{p.pid} ({p.container_pid})"


def _owner_text(process: ProcessSample) -> str:
    if process.owner is None:
        return "-"
    label = process.owner.label
    if cell_len(label) <= OWNER_CELLS:
        return label
    return set_cell_size(label, OWNER_CELLS - 1) + "…"


def format_age(seconds: float | None) -> str:
    return "N/A" if seconds is None else format_duration(max(0.0, seconds))


# Hundreds of rows every sample: the same few sizes and ages are formatted over and over. Small:
# an age is new every second, so a cache of thousands filled for over an hour (memory that grew
# ~0.1 MiB a minute, then stopped) and held ages no row showed any more.
_bytes = lru_cache(maxsize=1024)(format_bytes)
_age = lru_cache(maxsize=512)(format_age)


def rows_from(snapshot: Snapshot, only_gpu: int | None, needle: str,
              jobs: dict[int, tuple[str, str]] | None = None, unclaimed: Mapping[tuple[int, int], Any] | None = None,
              ) -> list[Row]:
    """`unclaimed`: (card, pid) -> its use without a claim (sharing/view.UseWithoutClaim)."""
    rows = []
    for gpu in snapshot.gpus:
        if only_gpu is not None and gpu.index != only_gpu:
            continue
        for p in gpu.processes:
            age = snapshot.time - p.started if p.started is not None else None
            name, job_id = (jobs or {}).get(p.pid, (None, None))
            use = (unclaimed or {}).get((gpu.index, p.pid))
            row = Row(gpu.index, p, age, name, job_id, use.on() if use is not None else None)
            if not needle or row.matches(needle):
                rows.append(row)
    return rows


class ProcessTable(SortableTable):
    COMPONENT_CLASSES = {"process-table--header", "process-table--cursor", "process-table--own",
                         "process-table--muted", "process-table--job", "process-table--unclaimed"}
    COLUMNS = COLUMNS
    SORTS = {"gpu_mem": True, "sm": True, "cpu": True, "pid": False, "user": False, "age": True, "owner": False}
    STRETCH = True

    class SortChanged(SortableTable.SortChanged):
        """The sort column or direction changed (the app shows it in the table's title)."""

    def __init__(self, invisible_reason: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.me = getpass.getuser()
        self.invisible_reason = invisible_reason
        self.rows_by_key: dict[str, Row] = {}
        self._natural_widths = self.widths  # before the owner column is left out of a narrow view

    # -- data in --

    def _cells_for(self, row: Row) -> Cells:
        p = row.process
        visible = p.user is not None or p.command is not None
        # Which container the process is in is the owner column's to say.
        prefix = f"[job {row.job}] " if row.job else ""
        if row.unclaimed:  # said first: it is what a person must see
            prefix = f"[no claim: {row.unclaimed}] " + prefix
        return (
            str(row.gpu), _pid_text(p), p.user or "?", "C" if p.type == "compute" else "G",
            _bytes(p.gpu_memory), "N/A" if p.sm_util is None else str(p.sm_util),
            "N/A" if p.cpu_percent is None else f"{p.cpu_percent:.0f}", _bytes(p.rss),
            _age(None if row.age is None else int(max(0, row.age))), _owner_text(p),
            (prefix + (p.command or "?")) if visible else self.invisible_reason,
        )

    def show(self, rows: list[Row]) -> None:
        """Show exactly `rows` in the current sort order, repainting only what changed."""
        keyed = {row.key: row for row in rows}
        cells = {key: self._cells_for(row) for key, row in keyed.items()}
        value = SORT_VALUES[self.sort_key]
        order = sorted(keyed, key=lambda k: (value(keyed[k]), k), reverse=self.sort_reverse)
        self._natural_widths = self._content_widths(cells)
        self.rows_by_key = keyed
        self._show_cells(order, cells, self._fitted(self._natural_widths))

    def _fitted(self, widths: list[int]) -> list[int]:
        """The columns' widths in this view: the owner column narrowed (its text cut with "…"), or
        left out (width 0), where it would leave the command too little room."""
        others = 1 + sum(w + GAP for i, w in enumerate(widths[:-1]) if i != OWNER)
        room = self.size.width - others - GAP - MIN_COMMAND_CELLS
        if room >= widths[OWNER]:
            return widths
        widths = widths.copy()
        widths[OWNER] = room if room >= MIN_OWNER_CELLS else 0
        return widths

    def _on_resize(self, event) -> None:
        super()._on_resize(event)
        widths = self._fitted(self._natural_widths)
        if widths != self.widths:
            self.widths = widths
            self.refresh()

    # -- drawing --

    def _styled_row(self, key: str, cells: Cells, on_cursor: bool) -> tuple[list[tuple[str, Style]], Style]:
        styles = self._styles()
        row = self.rows_by_key[key]
        texts = [(c, PLAIN) for c in cells]
        if row.process.user == self.me:
            texts[2] = (cells[2], styles["own"])
        visible = row.process.user is not None or row.process.command is not None
        texts[-1] = (cells[-1], styles["unclaimed"] if row.unclaimed else styles["job"] if row.job
                     else (PLAIN if visible else styles["muted"]))
        return texts, styles["cursor"] if on_cursor else PLAIN

    # -- cursor and keys --

    @property
    def selected_row(self) -> Row | None:
        if not self.order:
            return None
        return self.rows_by_key.get(self.order[min(self.cursor, len(self.order) - 1)])
