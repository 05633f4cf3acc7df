"""F9: the signals that can be sent to the selected process (as htop's F9), each then confirmed as x, X, i are."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, OptionList
from textual.widgets.option_list import Option

SIGNALS = [("terminate", "SIGTERM  terminate (x)"), ("kill", "SIGKILL  kill (X)"),
           ("interrupt", "SIGINT   interrupt (i)")]


class SignalMenu(ModalScreen[str | None]):
    BINDINGS = [Binding("escape,q,f9,f10", "dismiss", "Close")]
    DEFAULT_CSS = """
    SignalMenu { align: center middle; }
    SignalMenu > Vertical { width: 40; height: auto; border: round $accent; background: $surface; padding: 0 1; }
    SignalMenu OptionList { height: auto; }
    """

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(f"Send a signal to process {self.pid}", markup=False)
            yield OptionList(*(Option(text, id=kind) for kind, text in SIGNALS), id="signals")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_dismiss(self, result: str | None = None) -> None:  # type: ignore[override]
        self.dismiss(result)
