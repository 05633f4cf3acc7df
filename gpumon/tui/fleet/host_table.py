"""The fleet overview's table: one line per host, drawn line by line (Textual's line API).

Built to stay cheap at hundreds of hosts: only the rows on screen are ever rendered, each row's
strip is cached, and when the fleet reports a host, only that host's row is recomputed and only
the cells of it that changed are repainted (nothing if it is scrolled out of view). Sorting by a
value that moves (free cards, load) is redone at most every RESORT_S seconds, not per update, so
rows do not jump under the cursor; the cursor stays on its host through every re-sort.

Typing letters or digits jumps to the first host whose name starts with what was typed (keys
within JUMP_S of each other add up); `reserved` keys start no jump (they are the screen's
commands) but extend one under way when a host's name goes on with them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.events import Key
from textual.geometry import Region
from textual.message import Message
from textual.strip import Strip

from gpumon.model import HostStatus
from gpumon.tui.fleet.host_row import HostRow, host_row, time_dependent
from gpumon.tui.widgets.line_table import LineTable

SORTS = ("listed", "free", "load", "name", "health")  # the order `o` cycles through
SORT_LABELS = {"listed": "as listed", "free": "by free cards", "load": "by load", "name": "by name",
               "health": "worst health first"}
RESORT_S = 3.0
JUMP_S = 1.5
GAP = 2
STATE_WIDTH = 13
FREE_WIDTH, LOAD_WIDTH, HOT_WIDTH = 5, 4, 9
HEALTH_WIDTH = 7  # "HEALTH▲", "FAIL 12"; the column is there once some host has a verdict
MAX_NAME = 28
TONES = ("header", "cursor", "muted", "live", "stale", "away", "bad", "warn", "idle", "busy", "unknown", "lost",
         "mig", "old", "mem", "memwarn", "full", "caution")
# Every other cell carries an explicit `conceal=False` (renders as nothing): neighbouring cells then
# never merge into one segment, so repainting one cell sends that cell, not the whole line.
SEPARATOR = (Style(), Style(conceal=False))


def _fit(text: str, width: int, right: bool = False) -> str:
    """`text` in exactly `width` cells: cut with … or padded."""
    if cell_len(text) > width:
        while text and cell_len(text) > width - 1:
            text = text[:-1]
        text += "…"
    pad = " " * max(0, width - cell_len(text))
    return pad + text if right else text + pad


def _without_background(style: Style, background) -> Style:
    if style.bgcolor is None or style.bgcolor != background:
        return style
    return Style(color=style.color, bold=style.bold, dim=style.dim, italic=style.italic,
                 underline=style.underline, reverse=style.reverse)


def _sort_value(row: HostRow, key: str):
    """Smaller first; None: the host has no reading (always last)."""
    if key == "free":
        return None if row.free is None else -row.free
    if key == "load":
        return row.load
    if key == "health":
        return None if row.health_rank is None else (-row.health_rank[0], -row.health_rank[1])
    return row.name.lower()


class HostTable(LineTable):
    COMPONENT_CLASSES = {f"host-table--{tone}" for tone in TONES}

    class Jumped(Message):
        """Typed text moved the cursor (or found no host: `found` False)."""

        def __init__(self, prefix: str, found: bool) -> None:
            super().__init__()
            self.prefix = prefix
            self.found = found

    def __init__(self, names: Sequence[str], clock: Callable[[], float] = time.time,
                 reserved: str = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self.clock = clock
        self.reserved = set(reserved)
        self.listed = tuple(names)
        self._listed = set(self.listed)
        self.statuses: dict[str, HostStatus] = {}
        self.rows: dict[str, HostRow] = {}
        self.order: list[str] = list(self.listed)
        self.index_of = {name: i for i, name in enumerate(self.order)}
        self.sort_key = "listed"
        self.sort_reverse = False
        self.filter_text = ""
        self.name_width = max([5] + [min(MAX_NAME, cell_len(n)) for n in self.listed])  # "HOST▼"
        self.max_cards = 0
        self.health_width = 0  # no column until a host reports a card's verdict
        self._order_dirty = False
        self._sorted_at = 0.0
        self._jump = ""
        self._jump_at = 0.0
        self._styles: dict[str, Style] = {}
        self._styles_theme: str | None = None

    # -- data in --

    def update_host(self, status: HostStatus) -> tuple[HostRow | None, HostRow] | None:
        """A host's news: returns (old row, new row) when what the row shows changed, else None."""
        name = status.host
        if name not in self.statuses and name not in self._listed:
            self._add_host(name)
        self.statuses[name] = status
        row = host_row(status, self.clock())
        old = self.rows.get(name)
        if row == old:
            return None
        self.rows[name] = row
        if len(row.cards) > self.max_cards:  # a wider strip moves every column after it
            self.max_cards = len(row.cards)
            self._strips.clear()
            self.refresh()
        if row.health and not self.health_width:  # a new column moves every column after it
            self.health_width = HEALTH_WIDTH
            self._strips.clear()
            self.refresh()
        if old is not None and self._moves_order(old, row):
            self._order_dirty = True
        index = self.index_of.get(name)
        if index is not None:
            self._refresh_changed(index, old, row)
        return old, row

    def _add_host(self, name: str) -> None:
        """A host a source found (Prometheus discovers a cluster's nodes): listed after the
        others, shown at the next tick (a first refresh finds hundreds at once: one re-sort)."""
        self.listed += (name,)
        self._listed.add(name)
        width = min(MAX_NAME, cell_len(name))
        if width > self.name_width:
            self.name_width = width
            self._strips.clear()
            self.refresh()
        self._order_dirty = True
        self._sorted_at = 0.0

    def _moves_order(self, old: HostRow, new: HostRow) -> bool:
        if self.filter_text and old.matches(self.filter_text) != new.matches(self.filter_text):
            return True
        key = self.sort_key
        return key in ("free", "load", "health") and _sort_value(old, key) != _sort_value(new, key)

    def tick(self) -> None:
        """Once a second: countdowns of the rows on screen, and a re-sort when one is due."""
        if self._order_dirty and time.monotonic() - self._sorted_at >= RESORT_S:
            self.reorder()
        now = self.clock()
        for index in self.visible_indices():
            name = self.order[index]
            status = self.statuses.get(name)
            if status is not None and time_dependent(status):
                row = host_row(status, now)
                old = self.rows.get(name)
                if row != old:
                    self.rows[name] = row
                    self._refresh_changed(index, old, row)

    def reorder(self) -> None:
        """Filter and sort now (a user's request, or a re-sort that is due)."""
        self._order_dirty = False
        self._sorted_at = time.monotonic()
        current = self.order[self.cursor] if self.order and self.cursor < len(self.order) else None
        needle = self.filter_text
        names = [n for n in self.listed if not needle or (n in self.rows and self.rows[n].matches(needle))
                 or (n not in self.rows and needle.lower() in n.lower())]
        if self.sort_key == "name":
            names.sort(key=lambda n: n.lower(), reverse=self.sort_reverse)
        elif self.sort_key != "listed":
            values = {n: _sort_value(self.rows[n], self.sort_key) if n in self.rows else None for n in names}
            known = sorted((n for n in names if values[n] is not None), key=lambda n: values[n],
                           reverse=self.sort_reverse)
            names = known + [n for n in names if values[n] is None]
        elif self.sort_reverse:
            names.reverse()
        if names == self.order:
            return
        self.order = names
        self.index_of = {name: i for i, name in enumerate(names)}
        self.cursor = self.index_of.get(current, min(self.cursor, max(0, len(names) - 1)))
        self._set_virtual_height()
        self.refresh()
        self._scroll_to_cursor()

    def set_sort(self, key: str, reverse: bool) -> None:
        self.sort_key, self.sort_reverse = key, reverse
        self._strips.clear()  # the header's arrow moves
        self.reorder()
        self.refresh()

    def set_filter(self, text: str) -> None:
        self.filter_text = text
        self.reorder()

    # -- geometry --

    @property
    def cards_width(self) -> int:
        return max(len("CARDS"), 3 * self.max_cards - 1)

    def visible_indices(self) -> range:
        top = self.scroll_offset.y
        return range(top, min(len(self.order), top + max(0, self.size.height - 1)))

    # -- drawing --

    def _style(self, tone: str) -> Style:
        if self._styles_theme != self.app.theme:
            self._styles_theme = self.app.theme
            own = self.rich_style.bgcolor
            # A tone's background is the table's own unless the theme gives it one (lost cards):
            # left out, so the cursor's background shows through every cell of its row.
            self._styles = {t: _without_background(self.get_component_rich_style(f"host-table--{t}"), own)
                            for t in TONES}
            self._strips.clear()
        return self._styles[tone]

    def _cells(self, row: HostRow) -> list[tuple[str, str]]:
        """(text, tone) of every cell of a row, in order: name, state, each card's two glyphs
        (and the gap after), free, load, hottest, note."""
        tone = "muted" if not row.live else ""
        gap = (" " * GAP, "")
        cells = [(_fit(row.name, self.name_width), ""), gap, (_fit(row.state, STATE_WIDTH), row.state_tone), gap]
        if self.health_width:  # before the cards: a narrow terminal cuts the end of a line, not this
            cells += [(_fit(row.health, self.health_width), row.health_tone), gap]
        if not row.cards and row.free is None:  # nothing read yet: why, where the cards would be
            return cells + [(row.note, row.note_tone)]
        for i, cell in enumerate(row.cards):
            cells += [(cell.util, cell.util_tone), (cell.mem, cell.mem_tone)]
            if i < len(row.cards) - 1:
                cells.append((" ", ""))
        cells.append((" " * (self.cards_width - max(0, 3 * len(row.cards) - 1) + GAP), ""))
        free = "" if row.free is None else f"{row.free}/{row.total}"
        load = "" if row.load is None else f"{row.load:.0f}%"
        hot = "" if row.hottest is None else f"{row.hottest[0]}°C ({row.hottest[1]})"
        cells += [(_fit(free, FREE_WIDTH, right=True), tone if row.free else "muted"), gap,
                  (_fit(load, LOAD_WIDTH, right=True), tone), gap, (_fit(hot, HOT_WIDTH), tone), gap]
        cells.append((row.note, row.note_tone))
        return cells

    def _strip(self, cells: list[tuple[str, str]], width: int, base: Style) -> Strip:
        segments = [Segment(" ", base)]
        for i, (text, tone) in enumerate(cells):
            style = base + (self._style(tone) if tone else Style()) + SEPARATOR[i % 2]
            segments.append(Segment(text, style))
        return Strip(segments).crop_extend(0, width, base)

    def _header(self, width: int) -> Strip:
        arrow = "▼" if self.sort_reverse else "▲"
        labels = {"name": "HOST", "free": "FREE", "load": "LOAD", "health": "HEALTH"}
        marked = {k: v + (arrow if self.sort_key == k else "") for k, v in labels.items()}
        health = [_fit(marked["health"], self.health_width), "  "] if self.health_width else []
        texts = [_fit(marked["name"], self.name_width), "  ", _fit("STATE", STATE_WIDTH), "  ", *health,
                 _fit("CARDS", self.cards_width), "  ", _fit(marked["free"], FREE_WIDTH, right=True), "  ",
                 _fit(marked["load"], LOAD_WIDTH, right=True), "  ", _fit("HOTTEST", HOT_WIDTH), "  ", "NOTE"]
        return self._strip([(t, "") for t in texts], width, self._style("header"))

    def _row_strip(self, index: int, width: int) -> Strip:
        name = self.order[index]
        row = self.rows.get(name)
        on_cursor = index == self.cursor
        self._style("muted")  # drops cached strips when the theme changed
        signature = (row, width, on_cursor, self.name_width, self.max_cards, self.health_width)
        cached = self._strips.get(name)
        if cached is not None and cached[0] == signature:
            return cached[1]
        base = self._style("cursor") if on_cursor else Style()
        if row is None:
            strip = self._strip([(_fit(name, self.name_width), ""), ("  ", ""), ("…", "muted")], width, base)
        else:
            strip = self._strip(self._cells(row), width, base)
        self._strips[name] = (signature, strip)
        return strip

    def _refresh_changed(self, index: int, old: HostRow | None, new: HostRow) -> None:
        """Repaint the span of the row's cells that changed, if the row is on screen."""
        y = index - self.scroll_offset.y + 1
        if not 1 <= y < self.size.height:
            return
        if old is None or len(old.cards) != len(new.cards):
            self.refresh(Region(0, y, self.size.width, 1))
            return
        before, after = self._cells(old), self._cells(new)
        changed = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
        if not changed:
            return
        x = [1]
        for text, _ in after:
            x.append(x[-1] + cell_len(text))
        start, end = x[changed[0]], (x[changed[-1] + 1] if changed[-1] < len(after) - 1 else self.size.width)
        end = max(end, x[changed[-1]] + cell_len(before[changed[-1]][0]))
        self.refresh(Region(start, y, max(1, end - start), 1))

    # -- cursor, keys and jumps --

    @property
    def selected(self) -> str | None:
        return self.order[self.cursor] if self.order else None

    def select_host(self, name: str) -> bool:
        index = self.index_of.get(name)
        if index is not None:
            self.move_cursor(index)
        return index is not None

    def on_key(self, event: Key) -> None:
        char = event.character
        if not char or len(char) != 1 or not (char.isalnum() or char in "-_.@"):
            return
        now = time.monotonic()
        if self._jump and now - self._jump_at < JUMP_S and self._first_match(self._jump + char) is not None:
            prefix = self._jump + char
        elif char in self.reserved:
            self._jump = ""
            return  # a command key: the screen's binding acts
        else:
            prefix = char
        event.stop()
        event.prevent_default()
        self.jump(prefix)
        self._jump_at = now

    def _first_match(self, prefix: str) -> int | None:
        wanted = prefix.lower()
        return next((i for i, name in enumerate(self.order) if name.lower().startswith(wanted)), None)

    def jump(self, prefix: str) -> bool:
        """Move to the first host (in the order shown) whose name starts with `prefix`; typing
        more goes on from there, a prefix no host has starts over with the next key."""
        index = self._first_match(prefix)
        self._jump = prefix if index is not None else ""
        if index is not None:
            self.move_cursor(index)
        self.post_message(self.Jumped(prefix, index is not None))
        return index is not None
