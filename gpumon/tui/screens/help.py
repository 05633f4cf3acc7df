"""`?`: every key, grouped, with what it does."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS: list[tuple[str, list[tuple[str, str]]]] = [
    ("Cards", [
        ("↑ ↓  j k", "select a card (or click it)"),
        ("Tab", "move focus between cards and processes"),
        ("w", "chart window: 1, 5 or 10 minutes"),
        ("t", "topology: links between cards, CPU and NUMA affinity, best partners"),
    ]),
    ("Processes", [
        ("a", "all cards' processes / only the selected card's"),
        ("s  S", "cycle the sort column (GPU MEM, SM%, CPU%, PID, USER, AGE) / reverse it; or click a header"),
        ("/", "filter by text (pid, user, command, container); Esc clears"),
        ("x", "terminate the selected process (SIGTERM), after a confirmation"),
        ("X", "kill it (SIGKILL), after a confirmation"),
        ("i", "interrupt it (SIGINT), after a confirmation"),
        ("e", "show its environment (CUDA_VISIBLE_DEVICES, …) where readable"),
    ]),
    ("App", [
        ("!", "alerts firing now and recent alert events"),
        ("c", "next colour theme"),
        ("?", "this help"),
        ("q", "quit"),
    ]),
    ("Replay (--replay FILE)", [
        ("space", "pause / resume"),
        (".", "step one sample (pauses)"),
        ("+  -", "faster / slower"),
    ]),
    ("Jobs", [
        ("r", "run a command on the selected card: pinned by UUID, its NUMA node's CPUs, detached"),
        ("m", "default GPU memory limit for jobs on the selected card"),
        ("J", "jobs gpumon launched: state, log (following), s stop (asks first), p show its processes"),
    ]),
]


def help_table(readonly: bool) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for group, keys in KEYS:
        table.add_row(Text(group, style="bold underline"), "")
        for key, what in keys:
            if readonly and key in ("x", "X", "i"):
                what += " (off: --readonly)"
            table.add_row(key, what)
        table.add_row("", "")
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "dismiss", "Close")]

    def __init__(self, readonly: bool) -> None:
        super().__init__()
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body") as body:
            body.border_title = "gpumon keys"
            body.border_subtitle = "Esc to close"
            yield Static(help_table(self.readonly))
