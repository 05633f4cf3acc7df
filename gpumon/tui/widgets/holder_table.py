"""The users view's table: one row per user, with its jobs, pods and containers under it, and a
Slurm job's steps under the job (owners/holders.py `Holder`), drawn line by line as the process table is.

Rows keep their keys (host, kind, id) from sample to sample; on each sample only the cells whose
text changed are repainted (usually the ticking HELD/IDLE and the SM and power cells), and nothing
when a sample changes nothing on screen. Sorting keeps each user's rows together: users are ordered
by the sort column, and their jobs under them by the same column.
"""

from __future__ import annotations

from functools import lru_cache

from rich.style import Style

from gpumon.owners.holders import Holder, idle_cell
from gpumon.sanitize import printable
from gpumon.tui.widgets.sortable_table import GAP, PLAIN, Cells, Column, SortableTable
from gpumon.units import format_bytes, format_duration, format_energy

# `most`: the most cells a column takes, longer text is cut with …
COLUMNS = (Column("mark", "", most=1), Column("host", "HOST", most=20), Column("who", "WHO", most=40),
           Column("user", "USER", most=16), Column("cards", "CARDS", most=16),
           Column("mem", "MEM", right=True, most=8), Column("sm", "SM%", right=True, most=5),
           Column("power", "POWER", right=True, most=7), Column("energy", "ENERGY", right=True, most=10),
           Column("held", "HELD", right=True, most=7), Column("idle", "IDLE", right=True, most=7))
KEYS = [c.key for c in COLUMNS]
MARK, HOST = KEYS.index("mark"), KEYS.index("host")
DROPPED_FIRST = (KEYS.index("power"), KEYS.index("energy"))
# Then these are narrowed (their text cut with …), down to this many cells, in this order.
NARROWED = ((KEYS.index("who"), 12), (KEYS.index("user"), 8), (KEYS.index("host"), 8))
IDLE_MARK = "!"  # idle rows stand out without colour too
SORT_VALUES = {
    "who": lambda h: (h.host, h.label.lower()), "idle": lambda h: -1.0 if h.idle_s is None else h.idle_s,
    "mem": lambda h: h.gpu_memory or 0, "sm": lambda h: -1 if h.sm_util is None else h.sm_util,
    "power": lambda h: h.power_w or 0.0, "energy": lambda h: h.energy_j or 0.0, "held": lambda h: h.held_s or 0.0,
}


@lru_cache(maxsize=4096)
def _text(value: str | None) -> str:
    """A name from elsewhere (a user, a pod, a host) as it may be shown: control characters visible."""
    return printable(value or "?")


def cells_of(h: Holder, child: str) -> Cells:
    """A row's cells; `child`: the tree mark of a job/pod/container under its user ('' for a user)."""
    return (IDLE_MARK if h.idle else "", _text(h.host), child + _text(h.label),
            _text(h.user), ",".join(map(str, h.cards)) or "-", format_bytes(h.gpu_memory),
            "N/A" if h.sm_util is None else str(h.sm_util),
            "N/A" if h.power_w is None else f"{h.power_w:.0f}W",
            format_energy(h.energy_j, na="N/A"), "N/A" if h.held_s is None else format_duration(h.held_s),
            idle_cell(h))


def groups(holders: tuple[Holder, ...]) -> list[tuple[Holder, list[Holder]]]:
    """Each user's row with its jobs', pods' and containers' rows (the tracker lists them so)."""
    out: list[tuple[Holder, list[Holder]]] = []
    by_user: dict[tuple[str, str | None], list[Holder]] = {}
    for h in holders:
        if h.kind == "user":
            children: list[Holder] = []
            by_user[h.host, h.user] = children
            out.append((h, children))
        elif (h.host, h.user) in by_user:
            by_user[h.host, h.user].append(h)
        else:  # a card held without processes (a cluster read through Prometheus): no user known
            out.append((h, []))
    return out


def tree(user: Holder, children: list[Holder]) -> list[tuple[Holder, str]]:
    """The rows of a user (tree mark '') and its children, a Slurm job's steps under the job when it
    has more than one (one step says nothing the job's row does not)."""
    rows = [(user, "")]
    for i, h in enumerate(children):
        last = i == len(children) - 1
        rows.append((h, "└ " if last else "├ "))
        if len(h.steps) > 1:
            stem = "  " if last else "│ "
            rows.extend((s, stem + ("└ " if j == len(h.steps) - 1 else "├ ")) for j, s in enumerate(h.steps))
    return rows


def matches(h: Holder, needle: str) -> bool:
    return needle in " ".join(x for x in (h.host, h.label, h.id, h.user, h.kind) if x).lower()


class HolderTable(SortableTable):
    COMPONENT_CLASSES = {"holder-table--header", "holder-table--cursor", "holder-table--idle",
                         "holder-table--child"}
    COLUMNS = COLUMNS
    SORTS = {"who": False, "idle": True, "mem": True, "sm": True, "power": True, "energy": True, "held": True}
    # The mark is there exactly when the row is idle, and an idle row has a colour of its own.
    WHOLE_ROW = frozenset({MARK})

    class SortChanged(SortableTable.SortChanged):
        """The sort column or direction changed."""

    def __init__(self, hosts: bool = False, **kwargs) -> None:
        """`hosts`: a HOST column (the fleet's view)."""
        super().__init__(**kwargs)
        self.hosts = hosts
        self.filter_text = ""
        self.holder_of: dict[str, Holder] = {}  # by row key
        self.widths = [0] * len(COLUMNS)  # no header until the first show()
        self._holders: tuple[Holder, ...] = ()

    # -- data in --

    def show(self, holders: tuple[Holder, ...]) -> None:
        """Show these holders (filtered and sorted), repainting only the cells that changed."""
        self._holders = holders
        value = SORT_VALUES[self.sort_key]
        needle = self.filter_text.lower()
        by_key: dict[str, Holder] = {}
        cells: dict[str, Cells] = {}
        order: list[str] = []
        for user, children in sorted(groups(holders), key=lambda g: value(g[0]), reverse=self.sort_reverse):
            if needle and not matches(user, needle):
                children = [c for c in children if matches(c, needle)]
                if not children:
                    continue
            if self.sort_key != "who":
                children = sorted(children, key=value, reverse=self.sort_reverse)
            for h, child in tree(user, children):
                key = f"{h.host}\0{h.kind}\0{h.id}"
                by_key[key] = h
                cells[key] = cells_of(h, child)
                order.append(key)
        widths = self._content_widths(cells)
        widths[MARK] = 1
        if not self.hosts:
            widths[HOST] = 0
        self._drop_to_fit(widths)
        self.holder_of = by_key
        self._show_cells(order, cells, widths)

    def _drop_to_fit(self, widths: list[int]) -> None:
        """A narrow view leaves out POWER, then ENERGY, then narrows WHO, USER and HOST, before a line
        is cut: IDLE, what the view is for, stays at the end of the line (80 columns), with or
        without the fleet's HOST column and however long the names."""
        room = self.size.width

        def over() -> int:
            return 1 + sum(w + GAP for w in widths if w) - room if room else 0

        for column in DROPPED_FIRST:
            if over() <= 0:
                return
            widths[column] = 0
        for column, least in NARROWED:
            if over() > 0 and widths[column] > least:
                widths[column] = max(least, widths[column] - over())

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self.show(self._holders)

    def _reshow(self) -> None:
        self.show(self._holders)

    # -- drawing --

    def _styled_row(self, key: str, cells: Cells, on_cursor: bool) -> tuple[list[tuple[str, Style]], Style]:
        holder = self.holder_of[key]
        styles = self._styles()
        base = PLAIN
        if holder.idle:
            base = styles["idle"]
        elif holder.kind != "user":
            base = styles["child"]
        if on_cursor:
            base = base + styles["cursor"]
        return [(c, PLAIN) for c in cells], base

    # -- what tests and the screen read --

    def holder_at(self, index: int) -> Holder:
        return self.holder_of[self.order[index]]
