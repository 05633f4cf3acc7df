"""The `/` filter of a screen's table (the main, fleet and users screens): hidden until `/`, what
is typed filters as it is typed, Enter goes back to the table (hiding an empty box), Esc clears it.

A plain Input on Textual's public API: the keys typed right after `/` reach it, in order, because
the app hands keys on one at a time (tui/keys_one_at_a_time.py), not because the box reorders them.
"""

from __future__ import annotations

from textual.message import Message
from textual.widget import Widget
from textual.widgets import Input


class FilterBox(Input):
    class Filtered(Message):
        """The filter now reads `text` (stripped; "" for none)."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, placeholder: str, table: Widget, id: str | None = None) -> None:
        super().__init__(placeholder=placeholder, id=id)
        self.table = table  # where the focus goes back to

    @property
    def text(self) -> str:
        return self.value.strip()

    def on_mount(self) -> None:
        self.display = False

    def open(self, value: str | None = None) -> None:
        """`/`: shown and focused; `value`: filter by it now (J's `p`: a job's processes), the
        table keeping the focus."""
        self.display = True
        if value is None:
            self.focus()
        else:
            self.value = value
            self.table.focus()

    def clear(self) -> bool:
        """Esc: the filter gone and the box hidden; False if there was nothing to clear."""
        if not self.display and not self.value:
            return False
        self.value = ""
        self.display = False
        self.table.focus()
        return True

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Filtered(self.text))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if not self.text:
            self.display = False
        self.table.focus()
