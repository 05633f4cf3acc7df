"""`e`: a process's environment, CUDA variables first (the ones that decide which card it uses)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpumon.jobs.processes import CUDA_VARIABLES
from gpumon.tui.literal_text import plain


def environment_table(env: dict[str, str]) -> Table:
    """Names and values as the process has them (a PS1 full of `[`, escape codes): text, not markup."""
    table = Table.grid(padding=(0, 1))
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    for name in CUDA_VARIABLES:
        table.add_row(name, plain(env[name]) if name in env else Text("(not set)", style="dim"))
    table.add_row("", "")
    for name in sorted(env):
        if name not in CUDA_VARIABLES:
            table.add_row(plain(name), plain(env[name]))
    return table


class EnvironmentScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,e", "dismiss", "Close")]

    def __init__(self, title: str, env: dict[str, str]) -> None:
        super().__init__()
        self.title_text = title
        self.env = env

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="env-body") as body:
            body.border_title = plain(self.title_text)
            body.border_subtitle = "Esc to close"
            yield Static(environment_table(self.env))
