"""The process table, drawn line by line (Textual's line API) for a monitor that runs all day.

Rows have stable keys (card:pid). On each sample only the cells whose text changed are repainted,
so the terminal receives the few characters that changed, as curses would send them, and a quiet
sample sends nothing. Only visible rows are ever rendered (thousands of processes cost little),
each row's strip is cached, and the cursor and scroll position survive every update.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from functools import lru_cache

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip

from gpumon.model import ProcessSample, Snapshot
from gpumon.tui.widgets.line_table import LineTable
from gpumon.units import format_bytes, format_duration

COLUMNS = [("gpu", "GPU"), ("pid", "PID"), ("user", "USER"), ("type", "T"), ("gpu_mem", "GPU MEM"),
           ("sm", "SM%"), ("cpu", "CPU%"), ("rss", "HOST MEM"), ("age", "AGE"), ("owner", "OWNER"),
           ("command", "COMMAND")]
KEYS = [key for key, _ in COLUMNS]
RIGHT = {"gpu", "pid", "gpu_mem", "sm", "cpu", "rss", "age"}
# Sort keys the `s` key cycles through, with the direction each starts in (True: largest first).
SORTS = {"gpu_mem": True, "sm": True, "cpu": True, "pid": False, "user": False, "age": True, "owner": False}
OWNER = KEYS.index("owner")
OWNER_CELLS = 32  # longer owners (pod names) are cut with "…"
MIN_OWNER_CELLS = 10  # "job 4242.0": an owner column narrower than this is left out
MIN_COMMAND_CELLS = 24  # the owner column narrows, then is left out, before the command gets less than this
GAP = 2
SPACING = " " * GAP
LAST = len(COLUMNS) - 1
RIGHT_ALIGNED = [key in RIGHT for key, _ in COLUMNS]


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


def _owner_text(process: ProcessSample) -> str:
    if process.owner is None:
        return "-"
    label = process.owner.label
    if cell_len(label) <= OWNER_CELLS:
        return label
    return set_cell_size(label, OWNER_CELLS - 1) + "…"


def format_age(seconds: float | None) -> str:
    return "N/A" if seconds is None else format_duration(max(0.0, seconds))


# Hundreds of rows every sample: the same few sizes and ages are formatted over and over.
_bytes = lru_cache(maxsize=4096)(format_bytes)
_age = lru_cache(maxsize=4096)(format_age)


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


def _fit(text: str, cells: int) -> str:
    """`text` in at most `cells` terminal cells (wide characters take two), ending in … when cut."""
    if (len(text) if text.isascii() else cell_len(text)) <= cells:
        return text
    if cells <= 0:
        return ""
    # set_cell_size pads with a space where a wide character would have been split in two.
    return (text[: cells - 1] if text.isascii() else set_cell_size(text, cells - 1)) + "…"


# A row's cells: the text of each column, plus what decides its look.
Cells = tuple[str, ...]


class ProcessTable(LineTable):
    COMPONENT_CLASSES = {"process-table--header", "process-table--cursor", "process-table--own",
                         "process-table--muted", "process-table--job"}
    BINDINGS = [
        Binding("s", "cycle_sort", "Sort"),
        Binding("S", "reverse_sort", "Reverse", show=False),
        Binding("k", "cursor(-1)", show=False),
        Binding("j", "cursor(1)", show=False),
    ]

    class SortChanged(Message):
        """The sort column or direction changed (the app shows it in the table's title)."""

    def __init__(self, invisible_reason: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.me = getpass.getuser()
        self.invisible_reason = invisible_reason
        self.sort_key = "gpu_mem"
        self.sort_reverse = SORTS["gpu_mem"]
        self.rows_by_key: dict[str, Row] = {}
        self._cells: dict[str, Cells] = {}
        self.widths: list[int] = [len(label) + 1 for _, label in COLUMNS]
        self._natural_widths = self.widths  # before the owner column is left out of a narrow view
        self._style_cache: dict[str, Style] | None = None
        self._combined: dict[tuple[Style, Style], Style] = {}  # a cell's style, by row style and cell style

    # -- data in --

    def _cells_for(self, row: Row) -> Cells:
        p = row.process
        visible = p.user is not None or p.command is not None
        # Which container the process is in is the owner column's to say.
        prefix = f"[job {row.job}] " if row.job else ""
        return (
            str(row.gpu), str(p.pid), p.user or "?", "C" if p.type == "compute" else "G",
            _bytes(p.gpu_memory), "N/A" if p.sm_util is None else str(p.sm_util),
            "N/A" if p.cpu_percent is None else f"{p.cpu_percent:.0f}", _bytes(p.rss),
            _age(None if row.age is None else int(max(0, row.age))), _owner_text(p),
            (prefix + (p.command or "?")) if visible else self.invisible_reason,
        )

    def show(self, rows: list[Row]) -> None:
        """Show exactly `rows` in the current sort order, repainting only what changed."""
        cursor_key = self.order[self.cursor] if self.order and self.cursor < len(self.order) else None
        keyed = {row.key: row for row in rows}
        cells = {key: self._cells_for(row) for key, row in keyed.items()}
        value = SORT_VALUES[self.sort_key]
        order = sorted(keyed, key=lambda k: (value(keyed[k]), k), reverse=self.sort_reverse)
        # +1 on the label: room for the sort arrow in whichever column is sorted. Widths in cells;
        # only user names and owners may hold wide characters (the command takes what is left).
        columns = list(zip(*cells.values())) or [()] * len(COLUMNS)
        widths = [max([len(label) + 1] + list(map(cell_len if key in ("user", "owner") else len, columns[i])))
                  for i, (key, label) in enumerate(COLUMNS[:-1])]
        widths.append(0)
        self._natural_widths = widths
        widths = self._fitted(widths)
        old_cells, old_order = self._cells, self.order
        self.rows_by_key, self._cells = keyed, cells
        if cursor_key in cells:
            self.cursor = order.index(cursor_key)
        self.cursor = max(0, min(self.cursor, len(order) - 1))
        if order != old_order or widths != self.widths:
            self.order, self.widths = order, widths
            self._set_virtual_height()
            self._strips.clear()
            self.refresh()
            return
        self.order = order
        # Only rows on screen are repainted (the others are drawn afresh when scrolled to), all
        # in one refresh: each refresh call costs Textual more than drawing a row.
        top = self.scroll_offset.y
        regions = []
        for index in range(top, min(len(order), top + self.size.height - 1)):
            before, after = old_cells.get(order[index]), cells[order[index]]
            if before != after:
                changed = ([i for i, (a, b) in enumerate(zip(before, after)) if a != b] if before
                           else list(range(len(KEYS))))
                regions.append(self._cells_region(index - top + 1, changed))
        if regions:
            self.refresh(*regions)

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

    def _x(self, column: int) -> int:
        return 1 + sum(w + GAP for w in self.widths[:column] if w)

    def _cells_region(self, y: int, columns: list[int]) -> Region:
        """The region of these cells on line `y` of the view."""
        start = self._x(min(columns))
        end = self.size.width if max(columns) == len(KEYS) - 1 else self._x(max(columns)) + self.widths[max(columns)]
        return Region(start, y, max(1, end - start), 1)

    def _refresh_cells(self, index: int, columns: list[int]) -> None:
        """Repaint only these cells of row `index`, if it is on screen."""
        y = index - self.scroll_offset.y + 1
        if columns and 1 <= y < self.size.height:
            self.refresh(self._cells_region(y, columns))

    def _refresh_row(self, index: int) -> None:
        self._refresh_cells(index, list(range(len(KEYS))))

    def _styles(self) -> dict[str, Style]:
        # Textual drops its own cache of these at every refresh; they change only with the CSS.
        if self._style_cache is None:
            self._style_cache = {name: self.get_component_rich_style(f"process-table--{name}")
                                 for name in ("header", "cursor", "own", "muted", "job")}
        return self._style_cache

    def notify_style_update(self) -> None:
        self._style_cache = None
        self._combined.clear()
        self._strips.clear()
        super().notify_style_update()

    def _line(self, texts: list[tuple[str, Style]], width: int, base: Style) -> Strip:
        # Neighbouring cells in the same style make one segment: fewer segments for Textual to cut,
        # and the output layer sends only the cells that changed whatever the segments are.
        segments: list[Segment] = []
        run, run_style = [" "], base
        combined, widths = self._combined, self.widths
        used = 1
        for i, (text, style) in enumerate(texts):
            if not widths[i] and i < LAST:  # a column left out of a narrow view
                continue
            cell_style = combined.get((base, style))
            if cell_style is None:
                cell_style = combined[base, style] = base + style
            if cell_style != run_style:
                segments.append(Segment("".join(run), run_style))
                run, run_style = [], cell_style
            if i < LAST:
                cells = len(text) if text.isascii() else cell_len(text)
                if cells > widths[i]:  # a narrowed owner column
                    text, cells = set_cell_size(text, widths[i] - 1) + "…", widths[i]
                pad = " " * (widths[i] - cells)
                run.append((pad + text if RIGHT_ALIGNED[i] else text + pad) + SPACING)
                used += widths[i] + GAP
            else:  # the command takes what is left, cut with … when it does not fit
                room = max(0, width - used)
                text = _fit(text, room)
                run.append(text)
                rest = room - (len(text) if text.isascii() else cell_len(text))
                if rest > 0:
                    segments.append(Segment("".join(run), run_style))
                    run, run_style = [" " * rest], base
        segments.append(Segment("".join(run), run_style))
        if used > width:  # a narrow view: cut the fixed columns too
            return Strip(segments).crop_extend(0, width, base)
        return Strip(segments, width)

    def _header(self, width: int) -> Strip:
        texts = [(self.header_label(key), Style()) for key in KEYS]
        return self._line(texts, width, self._styles()["header"])

    def _row_strip(self, index: int, width: int) -> Strip:
        key = self.order[index]
        cells = self._cells[key]
        on_cursor = index == self.cursor and self.has_focus
        signature = (cells, tuple(self.widths), width, on_cursor)
        cached = self._strips.get(key)
        if cached is not None and cached[0] == signature:
            return cached[1]
        styles = self._styles()
        row = self.rows_by_key[key]
        plain = Style()
        texts = [(c, plain) for c in cells]
        if row.process.user == self.me:
            texts[2] = (cells[2], styles["own"])
        visible = row.process.user is not None or row.process.command is not None
        texts[-1] = (cells[-1], styles["job"] if row.job else (plain if visible else styles["muted"]))
        strip = self._line(texts, width, styles["cursor"] if on_cursor else plain)
        self._strips[key] = (signature, strip)
        return strip

    def on_focus(self) -> None:
        self._refresh_row(self.cursor)

    def on_blur(self) -> None:
        self._refresh_row(self.cursor)

    # -- cursor and keys --

    @property
    def row_count(self) -> int:
        return len(self.order)

    @property
    def selected_row(self) -> Row | None:
        if not self.order:
            return None
        return self.rows_by_key.get(self.order[min(self.cursor, len(self.order) - 1)])

    def cell_text(self, index: int, column: str) -> str:
        return self._cells[self.order[index]][KEYS.index(column)]

    def header_label(self, column: str) -> str:
        label = dict(COLUMNS)[column]
        return label + ("▼" if self.sort_reverse else "▲") if column == self.sort_key else label

    def header_clicked(self, x: int) -> None:
        """A click on a sortable header sorts by it; a second click reverses."""
        column = next((KEYS[i] for i in reversed(range(len(KEYS))) if x >= self._x(i)), None)
        if column in SORTS:
            if column == self.sort_key:
                self.sort_reverse = not self.sort_reverse
            else:
                self.sort_key, self.sort_reverse = column, SORTS[column]
            self._resort()

    def _resort(self) -> None:
        self.order = []  # forces a full repaint in the new order at the next show()
        self.refresh()
        self.post_message(self.SortChanged())

    def action_cycle_sort(self) -> None:
        keys = list(SORTS)
        self.sort_key = keys[(keys.index(self.sort_key) + 1) % len(keys)]
        self.sort_reverse = SORTS[self.sort_key]
        self._resort()

    def action_reverse_sort(self) -> None:
        self.sort_reverse = not self.sort_reverse
        self._resort()
