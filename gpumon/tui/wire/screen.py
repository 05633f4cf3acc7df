"""What the terminal shows, what Textual wants it to show, and the fewest bytes from one to the other.

Textual repaints a changed line of a widget from the widget's left edge, and writes every styled
segment as `ESC[<all attributes>m text ESC[0m`. Curses instead keeps two screens, the one it
wants and the one the terminal has, and sends only the cells that differ, with the cheapest cursor
move and only the attributes that change. `ScreenDiff` does the same with Textual's output: it
reads what Textual writes (cursor moves, attributes, text) into the wanted screen, and `render()`
returns what the terminal needs to catch up. Between two renders any number of Textual frames may
arrive: only the last state of each cell is sent, which is how frames are skipped on a slow link.

Sequences that are not drawing (modes, queries, titles) pass through in order; those that change
the screen in ways not modelled here (clearing it, switching to the alternate screen, a reset)
first send what is pending, then go out, then make every cell unknown, so it is sent again.
Textual writes whole escape sequences per write, which this relies on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

from rich.cells import cell_len, get_character_cell_size

from gpumon.tui.wire import sgr

_TOKEN = re.compile(
    r"(?P<text>[^\x00-\x1f\x7f]+)"           # printable text (ESC is \x1b, a control)
    r"|\x1b\[(?P<sgr>[0-9;]*)m"               # attributes: the most common sequences, first
    r"|(?P<cup>\x1b\[\d*(?:;\d*)?H)"           # cursor position
    r"|\x1b\[(?P<csi>[0-?]*[ -/]*[@-~])"      # CSI: parameters, intermediates, final byte
    r"|(?P<string>\x1b[\]P_^].*?(?:\x07|\x1b\\))"  # OSC, DCS, APC, PM strings
    r"|\x1b(?P<esc>[ -/]*[0-~])"              # other escape sequences
    r"|(?P<ctl>[\x00-\x1f\x7f])",             # a lone control character
    re.S,
)
SYNC_START, SYNC_END = "\x1b[?2026h", "\x1b[?2026l"
SYNC_MIN = 512  # bytes of drawing from which a render is wrapped in synchronized output
# Private modes that swap or reset the whole screen.
_SCREEN_MODES = {"?1049", "?1047", "?47"}
# CSI finals that only ask or set modes: they move no cursor and change no cell.
_HARMLESS = set("hlnpcqt")
GAP = 4  # unchanged cells between two changes that are sent again rather than jumped over
UNKNOWN = None  # a cell of the terminal whose content is not known


class ScreenDiff:
    def __init__(self, width: int = 80, height: int = 24) -> None:
        self.width, self.height = width, height
        self.sync = False  # Textual asked for synchronized output: the terminal has it
        self.cursor_visible = True
        self._cursor_placed = True  # False after a screen switch, until Textual places the cursor
        self._outbox: list[str] = []  # what must go out before the next drawing, in order
        self.resize(width, height)

    # -- the two screens --

    def resize(self, width: int, height: int) -> None:
        """A new size: nothing on the terminal is known any more (it may have reflowed)."""
        self.width, self.height = width, height
        self._want_text = [[" "] * width for _ in range(height)]
        self._want_style = [[sgr.DEFAULT] * width for _ in range(height)]
        self.forget()
        self._dirty.clear()  # Textual repaints everything after a resize
        self._y = self._x = 0
        self._style = sgr.DEFAULT

    def forget(self) -> None:
        """Every cell of the terminal is unknown: the next render sends the whole wanted screen."""
        self._have_text = [[UNKNOWN] * self.width for _ in range(self.height)]
        self._have_style = [[UNKNOWN] * self.width for _ in range(self.height)]
        self._dirty = {y: [0, self.width] for y in range(self.height)}
        self._term_y = self._term_x = None  # the terminal's cursor, None: unknown
        self._term_style = None

    def _clear_both(self) -> None:
        """The terminal cleared its screen (ED 2): blank on both sides."""
        for y in range(self.height):
            self._want_text[y][:] = [" "] * self.width
            self._want_style[y][:] = [sgr.DEFAULT] * self.width
            self._have_text[y][:] = [" "] * self.width
            self._have_style[y][:] = [sgr.DEFAULT] * self.width
        self._dirty.clear()

    # -- reading what Textual writes --

    def feed(self, data: str) -> None:
        apply = sgr.apply
        for match in _TOKEN.finditer(data):
            kind = match.lastgroup
            if kind == "text":
                self._write(match.group("text"))
            elif kind == "sgr":
                self._style = apply(self._style, match.group("sgr"))
            elif kind == "cup":
                row, _, col = match.group("cup")[2:-1].partition(";")
                self._y, self._x = int(row or 1) - 1, int(col or 1) - 1
            elif kind == "csi":
                self._csi(match.group("csi"), match.group(0))
            elif kind == "ctl":
                self._control(match.group(0))
            elif kind == "esc" and match.group("esc") in ("c", "7", "8", "D", "E", "M"):  # resets, moves
                self._barrier(match.group(0))
            else:  # strings (titles, queries) and charset selections: no cell changes
                self._outbox.append(match.group(0))

    def place_cursor(self, y: int, x: int) -> None:
        """Where Textual leaves the cursor after a frame (shown there when it is visible)."""
        self._y, self._x = y, x
        self._cursor_placed = True

    def put(self, y: int, x: int, runs: Iterable[tuple[str, sgr.State]]) -> None:
        """Pieces of text from (y, x) on, each in its attributes: a line of a compositor update
        handed over as cells (see updates.py) rather than as escape sequences."""
        self._y, self._x = y, x
        for text, state in runs:
            self._style = state
            self._write(text)

    def _write(self, text: str) -> None:
        y, x = self._y, self._x
        if not 0 <= y < self.height or x >= self.width:
            return
        chars, styles = self._want_text[y], self._want_style[y]
        if chars[x] == "":  # over the right half of a wide character: its left half goes too
            chars[x - 1] = " "
        width = cell_len(text)
        if width == len(text):  # one cell per character: the common case, done in slices
            end = min(self.width, x + width)
            chars[x:end] = text[: end - x]
        else:
            cells: list[str] = []
            for char in text:
                size = get_character_cell_size(char)
                if size == 2:
                    cells += (char, "")
                elif size == 1:
                    cells.append(char)
                elif cells:  # zero width: joins the character before it
                    cells[-1 - (cells[-1] == "")] += char
            end = min(self.width, x + len(cells))
            chars[x:end] = cells[: end - x]
            if end == self.width and chars[-1] != "" and get_character_cell_size(chars[-1][:1]) == 2:
                chars[-1] = " "  # half a wide character does not fit at the edge
        # A run of blanks keeps whatever foreground the terminal has (see sgr.blank).
        styles[x:end] = [sgr.blank(self._style) if text.isspace() else self._style] * (end - x)
        self._x = end
        if end < self.width and chars[end] == "":  # over the left half of a wide character
            chars[end] = " "
            end += 1
        span = self._dirty.get(y)
        if span is None:
            self._dirty[y] = [max(0, x - 1), end]
        else:
            span[0], span[1] = min(span[0], max(0, x - 1)), max(span[1], end)

    def _csi(self, body: str, sequence: str) -> None:
        final, params = body[-1], body[:-1]
        if final == "m":
            self._style = sgr.apply(self._style, params)
        elif final in "Hf":
            row, _, col = params.partition(";")
            self._y, self._x = int(row or 1) - 1, int(col or 1) - 1
        elif final in "ABCDGd":
            n = int(params or 1) if params.isdigit() or not params else 1
            if final == "A":
                self._y -= n
            elif final == "B":
                self._y += n
            elif final == "C":
                self._x += n
            elif final == "D":
                self._x = max(0, self._x - n)
            elif final == "G":
                self._x = n - 1
            else:
                self._y = n - 1
        elif final in "hl" and params.startswith("?"):
            modes = set(params.split(";"))
            if sequence in (SYNC_START, SYNC_END):
                self.sync = True  # renders are wrapped in it instead (see render)
            elif modes & _SCREEN_MODES:
                self._barrier(sequence)
                # The terminal put back the cursor of the screen it switched to (leaving: the
                # shell's, after its last output): showing the cursor must not move it.
                self._cursor_placed = False
            else:
                if "?25" in modes:
                    self.cursor_visible = final == "h"
                    if self.cursor_visible and self._cursor_placed:  # shown where Textual put it
                        self._outbox.append(self._move(self._y, self._x))
                self._outbox.append(sequence)
        elif final in _HARMLESS or (final == "u" and params[:1] in ("<", ">", "=", "?")):
            self._outbox.append(sequence)
        elif final == "J" and params == "2":
            self._outbox.append(self._render_screen())
            self._outbox.append(sequence)
            self._clear_both()
        else:  # any other editing: send it, and trust nothing on the terminal after it
            self._barrier(sequence)

    def _control(self, char: str) -> None:
        if char == "\r":
            self._x = 0
        elif char == "\n":
            self._y, self._x = self._y + 1, 0
        elif char == "\b":
            self._x = max(0, self._x - 1)
        else:  # bell and the like
            self._outbox.append(char)

    def _barrier(self, sequence: str) -> None:
        """A sequence that changes the screen in ways not modelled: pending cells go out first."""
        self._outbox.append(self._render_screen())
        if self._term_style != sgr.DEFAULT:  # the next screen starts with plain attributes
            self._outbox.append("\x1b[0m")
        self._outbox.append(sequence)
        # Nothing is known on either side now: what Textual draws next is sent as it comes (it
        # repaints after a screen switch; after leaving the alternate screen it draws nothing).
        self.forget()
        self._dirty.clear()

    # -- sending the difference --

    def render(self, draw: bool = True) -> str:
        """Everything that must go out: pass-through sequences, and (with `draw`) the cells that
        differ from what the terminal has. Without `draw`, changed cells wait for a later render."""
        out = "".join(self._outbox)
        self._outbox.clear()
        if draw:
            screen = self._render_screen()
            if len(screen) > SYNC_MIN and self.sync:  # small updates cannot tear
                screen = SYNC_START + screen + SYNC_END
            out += screen
        return out

    @property
    def pending(self) -> bool:
        """Are there changed cells the terminal has not been sent?"""
        return bool(self._dirty)

    def _render_screen(self) -> str:
        out: list[str] = []
        runs: list[tuple[int, int, int]] = []
        for y in sorted(self._dirty):
            x1, x2 = self._dirty[y]
            want_text, want_style = self._want_text[y], self._want_style[y]
            have_text, have_style = self._have_text[y], self._have_style[y]
            if want_text[x1:x2] == have_text[x1:x2] and want_style[x1:x2] == have_style[x1:x2]:
                continue
            runs.extend((y, start, end) for start, end in self._runs(y, x1, x2))
        for y, start, end in self._drawing_order(runs):
            want_text, want_style = self._want_text[y], self._want_style[y]
            out.append(self._move(y, start))
            self._draw(out, want_text, want_style, start, end)
            self._have_text[y][start:end] = want_text[start:end]
            self._have_style[y][start:end] = want_style[start:end]
        self._dirty.clear()
        if out and self.cursor_visible:
            out.append(self._move(self._y, self._x))
        return "".join(out)

    def _drawing_order(self, runs: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
        """Top to bottom, except that a change with another in the same column on the next line goes
        on down that column when the way down is shorter than the way to the next change on the line:
        a table's changed column is sent as one column (`\b\b ESC[B` between cells, not a jump to
        the next cell of the line and an absolute move to the next line)."""
        at = {(y, start): i for i, (y, start, _) in enumerate(runs)}
        done = [False] * len(runs)
        order: list[tuple[int, int, int]] = []
        following = 0  # the first run, top to bottom, not yet drawn
        current: tuple[int, int, int] | None = None
        while len(order) < len(runs):
            while done[following]:
                following += 1
            choice = following
            if current is not None:
                below = at.get((current[0] + 1, current[1]))
                if below is not None and not done[below] and below != following:
                    end = current[2] if current[2] < self.width else None
                    by_line = _move_cost(current[0], end, runs[following][0], runs[following][1])
                    by_column = _move_cost(current[0], end, runs[below][0], runs[below][1])
                    if by_column < by_line:
                        choice = below
            done[choice] = True
            current = runs[choice]
            order.append(current)
        return order

    def _runs(self, y: int, x1: int, x2: int) -> list[tuple[int, int]]:
        """Spans of cells that differ, joined across short unchanged gaps, never splitting a wide
        character on either screen."""
        want_text, want_style = self._want_text[y], self._want_style[y]
        have_text, have_style = self._have_text[y], self._have_style[y]
        changed = [x for x, a, b, c, d in zip(range(x1, x2), want_text[x1:x2], have_text[x1:x2],
                                                 want_style[x1:x2], have_style[x1:x2]) if a != b or c != d]
        runs: list[list[int]] = []
        for x in changed:
            if runs and x - runs[-1][1] <= GAP:
                runs[-1][1] = x + 1
            else:
                runs.append([x, x + 1])
        for run in runs:
            while run[0] > 0 and (want_text[run[0]] == "" or have_text[run[0]] == ""):
                run[0] -= 1
            while run[1] < self.width and (want_text[run[1]] == "" or have_text[run[1]] == ""):
                run[1] += 1
        return [(a, b) for a, b in runs]

    def _draw(self, out: list[str], text: list[str], style: list, start: int, end: int) -> None:
        """Cells start..end of a line, the cursor already at start."""
        x = start
        while x < end:
            current = style[x]
            stop = x + 1
            while stop < end and style[stop] == current:
                stop += 1
            if self._term_style != current:
                if text[x] == " " and all(c == " " for c in text[x:stop]):
                    current = sgr.blank_over(self._term_style, current)
                if self._term_style != current:
                    out.append(sgr.change(self._term_style, current) if self._term_style is not None
                               else f"\x1b[0;{sgr.full(current)}m" if current != sgr.DEFAULT else "\x1b[0m")
                    self._term_style = current
            out.append("".join(text[x:stop]))
            x = stop
        self._term_x = end if end < self.width else None  # at the right edge the cursor's place varies

    def _move(self, y: int, x: int) -> str:
        """The shortest cursor movement from where the terminal's cursor is to (y, x)."""
        ty, tx = self._term_y, self._term_x
        self._term_y, self._term_x = y, x
        return _movement(ty, tx, y, x)


def _horizontal(tx: int, x: int) -> list[str]:
    """Ways along a line from column tx to x (0-based)."""
    if tx == x:
        return [""]
    ways = [f"\x1b[{x + 1}G"]  # CHA
    if x == 0:
        ways.append("\r")
    if x > tx:
        ways.append(f"\x1b[{x - tx}C" if x - tx > 1 else "\x1b[C")
    else:
        ways.append(f"\x1b[{tx - x}D" if tx - x > 1 else "\x1b[D")
        if tx - x <= 4:
            ways.append("\b" * (tx - x))  # backspace moves left without erasing
    return ways


# The same moves come back every frame (a table's cells, the clock); 8192 took half an hour at
# 10 frames a second to fill (~2 MiB) with moves seen once.
@lru_cache(maxsize=2048)
def _movement(ty: int | None, tx: int | None, y: int, x: int) -> str:
    """The shortest way from (ty, tx) to (y, x); unknown: the absolute position. Downwards the
    cursor never scrolls (CUD stops at the last line) and never wraps."""
    absolute = f"\x1b[{y + 1};{x + 1}H" if x else f"\x1b[{y + 1}H"
    if ty is None or tx is None:
        return absolute
    if ty == y:
        return min(_horizontal(tx, x), key=len)
    vertical = f"\x1b[{y - ty}B" if y > ty else f"\x1b[{ty - y}A"
    if abs(y - ty) == 1:
        vertical = vertical.replace("1", "", 1)
    return min([absolute, *(vertical + way for way in _horizontal(tx, x))], key=len)


def _move_cost(ty: int, tx: int | None, y: int, x: int) -> int:
    return len(_movement(ty, tx, y, x))
