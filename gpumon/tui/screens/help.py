"""`?`: every key, grouped, with what it does, and what the labels on a card mean."""

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
        ("h", "health: the card's verdict (WARN/FAIL on its panel), reasons, actions, every counter"),
    ]),
    ("Processes", [
        ("a", "all cards' processes / only the selected card's"),
        ("s  S  F6", "cycle the sort column (GPU MEM, SM%, CPU%, PID, USER, AGE) / reverse it; or click a header"),
        ("/  F3", "filter by text (pid, user, command, container); Esc clears"),
        ("x", "terminate the selected process (SIGTERM), after a confirmation"),
        ("X", "kill it (SIGKILL), after a confirmation"),
        ("i", "interrupt it (SIGINT), after a confirmation"),
        ("F9", "choose a signal for the selected process (TERM, KILL, INT), then confirm"),
        ("e", "show its environment (CUDA_VISIBLE_DEVICES, …) where readable"),
        ("Enter", "the selected process on a screen of its own: whole command line, owner, start time, charts "
                  "of its GPU memory, SM% and CPU%; x X i F9 e act on it there; Esc or q back"),
    ]),
    ("Users (u)", [
        ("u", "who holds the cards: each user with its Slurm jobs, pods and containers; cards, memory, SM%, "
              "power share, energy, time held, and idle time (! marks a holder idle: 0% SM); u, Esc or q back"),
        ("s  S  /", "in the users view: sort (who, idle, memory, SM%, power, energy, held) / reverse / filter"),
    ]),
    ("App", [
        ("!", "alerts firing now and recent alert events"),
        ("c", "next colour theme"),
        ("b", "low bandwidth (slow links): redraw every 5 s; on by itself when the terminal falls behind"),
        ("?  F1", "this help"),
        ("q  F10  Ctrl-C", "quit"),
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
    ("Many hosts (--hosts)", [
        ("Enter  →", "open the selected host's own view (cards, charts, processes, t); Esc or ← returns"),
        ("a name", "type it to jump to the first host that starts with it"),
        ("/", "filter hosts by name, state, source (nvidia-smi) or reason"),
        ("o  O", "sort: as listed, free cards, load, name / reverse"),
        ("r  R", "run on the selected host's least loaded free card / the fleet's; in a host's view: on its "
                 "selected card (its gpumon launches, pins and limits the job there)"),
        ("J", "the jobs of every host, with its log following; s stops the selected one there"),
        ("u", "who holds the cards on every host (a HOST column); in a host's view, on that host"),
    ]),
]


# What a card's labels mean (not keys: the second column explains the first).
LABELS: list[tuple[str, str]] = [
    ("CUDA n", "the device number programs started from this shell see (CUDA_VISIBLE_DEVICES / "
               "CUDA_DEVICE_ORDER are set); nvidia-smi and gpumon number cards in PCI order"),
    ("hidden · no CUDA", "CUDA_VISIBLE_DEVICES leaves this card out: those programs cannot see it"),
    ("CUDA ?", "depends on CUDA's own \"fastest first\" order, which only the CUDA runtime knows when the "
               "models differ; set CUDA_DEVICE_ORDER=PCI_BUS_ID, or name cards by UUID, to make it certain"),
    ("not responding", "the card's driver calls have not answered for that long; its last values are "
                       "shown, the other cards keep updating"),
    ("XID n", "a recent XID error of the card (the driver's error code; 79: fell off the bus)"),
    ("fabric …", "an NVSwitch board's card not registered with the fabric: is nvidia-fabricmanager running?"),
]


def help_table(readonly: bool) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for group, keys in KEYS:
        table.add_row(Text(group, style="bold underline"), "")
        for key, what in keys:
            if readonly and key in ("x", "X", "i", "F9", "r", "m", "r  R"):
                what += " (off: --readonly)"
            elif readonly and key == "J":
                what += " (s is off: --readonly)"
            table.add_row(key, what)
        table.add_row("", "")
    table.add_row(Text("On a card", style="bold underline"), "")
    for label, what in LABELS:
        table.add_row(label, what)
    return table


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark,f1", "dismiss", "Close")]

    def __init__(self, readonly: bool) -> None:
        super().__init__()
        self.readonly = readonly

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-body") as body:
            body.border_title = "gpumon keys"
            body.border_subtitle = "Esc to close"
            yield Static(help_table(self.readonly))
