"""Text from elsewhere (the driver, /proc, other hosts, job records and output, Prometheus, the
config) on screen exactly as it is.

Textual reads a plain `str` as markup almost everywhere: notifications, `Static`, `Label`, border
titles, `DataTable` cells, and Rich tables inside a `Static`. There a host's `[/]` raises
MarkupError, `[b]x` is drawn bold and `[@click=app.quit]` is an action link. A `Text` is never
parsed; these helpers also show control, bidi and zero-width characters as visible escapes
(`sanitize.printable`), so a job's colour codes or a card name's cursor moves never reach the
terminal.
"""

from __future__ import annotations

import re

from rich.style import Style
from rich.text import Text

from gpumon.sanitize import printable

_BREAKS = re.compile(r"\r\n|\r|\n")


def plain(text: str | None, style: str | Style = "") -> Text:
    """One line of text from elsewhere, never markup."""
    return Text(printable(text or ""), style=style)


def plain_lines(text: str) -> str:
    """Text of several lines (a host's answer, a job's output): each line made printable, the
    line breaks kept. A carriage return ends a line too, as Textual's Log reads it: a progress bar
    redrawn with \\r shows its latest state on a line of its own, not at the end of one long line."""
    if text.isascii() and text.isprintable():
        return text
    return "\n".join(printable(line) for line in _BREAKS.split(text))
