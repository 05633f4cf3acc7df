"""`r`: launch a command on the selected card; `m`: the card's default GPU memory limit."""

from __future__ import annotations

import os
from dataclasses import dataclass

from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.suggester import SuggestFromList
from textual.widgets import Button, Checkbox, Input, Label, Static

from gpumon.errors import UsageError
from gpumon.jobs.container_command import OtherCards, check_cards, locate
from gpumon.jobs.launch import DIALOG_FAILOVER
from gpumon.jobs.placement import busy_note
from gpumon.model import GpuSample
from gpumon.units import format_bytes, parse_size


def size_problem(text: str, gpu: GpuSample) -> str | None:
    """Why a typed SIZE is not usable on this card, or None when it is."""
    try:
        size = parse_size(text, gpu.memory_total)
    except UsageError as exc:
        return str(exc)
    if gpu.memory_total and size > gpu.memory_total:  # caps nothing: a typo, or the wrong card
        return f"{text} is more than the card's memory ({format_bytes(gpu.memory_total)})"
    return None


@dataclass
class RunChoice:
    command: str
    cwd: str
    mem_limit: str | None
    numa: bool
    foreground: bool
    wait: bool
    failover: int = 0  # moves to other cards allowed if the card fails


def container_problem(command: str, gpu: GpuSample) -> str | None:
    """Why a typed command line's container would see other cards than the card's, or None."""
    located = locate(["/bin/sh", "-c", command])
    if located is None:
        return None
    try:
        check_cards(located.container, [gpu.ref or ""], [gpu.index])
    except OtherCards as exc:
        return str(exc)
    return None


def directory_problem(text: str) -> str | None:
    """Why a typed working directory is not usable, or None when it is."""
    path = os.path.abspath(os.path.expanduser(text))
    if not os.path.isdir(path):
        return f"working directory does not exist: {path}"
    if not os.access(path, os.X_OK):
        return f"working directory is not accessible: {path}"
    return None


class Option(Checkbox, inherit_bindings=False):
    """A checkbox that Space toggles and Enter leaves to the dialog (which launches)."""

    BINDINGS = [Binding("space", "toggle_button", "Toggle", show=False)]


# What `r` says on demo data: the dialog launches a real command, pinned to a card that is not there.
def simulated_note(gpu) -> str:
    """The note over a simulated card's dialog, in its vendor's runtime's words (ROCm, oneAPI, CUDA)."""
    from gpumon.vendors import vendor

    return f"Simulated card (--demo), real job: it runs here and {vendor(gpu.vendor).runtime} sees no GPU."
FULL_HEIGHT, FULL_WIDTH = 32, 96  # the terminal size from which the dialog has its framed widgets


class RunDialog(ModalScreen[RunChoice | None]):
    # Enter launches from any field; on a button it presses that button (Cancel cancels). Not a
    # priority binding: those run when the key reaches the app, before the keys typed ahead of it
    # have reached the field (each widget has its own queue), so a command typed or pasted with its
    # Enter would launch cut short. Here Enter goes the way every key goes, after them: an Input
    # submits, a button presses, and a checkbox (`Option`) leaves it to this binding.
    BINDINGS = [Binding("escape", "cancel", "Cancel"), Binding("enter", "submit", "Launch", show=False)]

    def __init__(self, gpu: GpuSample, history: list[str], default_limit: int | None, cwd: str,
                 where: str | None = None, remote: bool = False, note: str = "") -> None:
        """`where`: the card as people should read it (a fleet's HOST:INDEX); `remote`: the job
        runs on another host, so the working directory is that host's (empty: the home there) and
        is checked there, not here; `note`: a line above the fields (simulated_note)."""
        super().__init__()
        self.gpu = gpu
        self.cwd = cwd
        self.history = history
        self.default_limit = default_limit
        self.where = where or f"GPU {gpu.index}"
        self.remote = remote
        self.note = note

    def compose(self) -> ComposeResult:
        with Vertical(id="run-body") as body:
            body.border_title = Text(f"Run on {self.where}: {self.gpu.name}")  # a host's card name: not markup
            body.border_subtitle = "Enter launches · Esc cancels · ↑ history"
            if busy := busy_note(self.gpu, self.where):  # it still launches: the user chose the card
                yield Static(Text(busy), id="run-busy")
            if self.note:
                yield Static(Text(self.note), id="run-note")
            yield Label("Command")
            yield Input(placeholder="python train.py --epochs 10", id="run-command",
                        suggester=SuggestFromList(self.history, case_sensitive=True),
                        # Empty at first: selecting it on focus only let a late Focus event select
                        # the first key typed, which the second then replaced ("touch" -> "ouch").
                        select_on_focus=False)
            yield Label("Working directory" + (" there (empty: your home there)" if self.remote else ""))
            yield Input(self.cwd, id="run-cwd")
            yield Label("GPU memory limit (e.g. 8G, 50%; empty: none)")
            yield Input(format_bytes(self.default_limit, na="") if self.default_limit else "", id="run-limit")
            with Horizontal(id="run-options"):
                yield Option("NUMA CPUs", True, id="run-numa", tooltip="pin to the CPUs next to the card")
                yield Option("Foreground", False, id="run-foreground", tooltip="run in this terminal and wait")
                yield Option("Wait until free", False, id="run-wait", tooltip="queue until the card is free")
                yield Option("Failover", False, id="run-failover",
                               tooltip=f"if the card fails (lost, fatal XID), start the job again on another "
                                       f"free card, up to {DIALOG_FAILOVER} times")
            yield Static("", id="run-error")
            with Horizontal(id="run-buttons"):
                yield Button("Launch", variant="primary", id="run-launch")
                yield Button("Cancel", id="run-cancel")

    def on_mount(self) -> None:
        # At once, not as focus() does (later, through the app's queue): a key typed as the dialog
        # opens goes into the command, never to the dialog around it.
        self.set_focus(self.query_one("#run-command", Input))

    def on_resize(self, event: events.Resize) -> None:
        # Fields, options and buttons without their frames (a line each) where the full dialog
        # would not fit: every one of them stays on screen, none behind a scrollbar.
        compact = event.size.height < FULL_HEIGHT or event.size.width < FULL_WIDTH
        for widget in self.query("Input, Checkbox, Button"):
            widget.compact = compact
        self.set_class(compact, "-compact")

    def on_key(self, event) -> None:
        # ↑ in the command box walks back through earlier commands.
        box = self.query_one("#run-command", Input)
        if event.key == "up" and self.focused is box and self.history:
            current = self.history.index(box.value) + 1 if box.value in self.history else 0
            box.value = self.history[min(current, len(self.history) - 1)]
            box.cursor_position = len(box.value)
            event.stop()

    def _choice(self) -> RunChoice | None:
        """What to launch, or None with the problem shown (everything typed stays as it is)."""
        command = self.query_one("#run-command", Input).value.strip()
        cwd = self.query_one("#run-cwd", Input).value.strip() or self.cwd
        limit = self.query_one("#run-limit", Input).value.strip() or None
        error = self.query_one("#run-error", Static)
        if not command:
            error.update("Type a command to run.")
            return None
        for problem, field in ((container_problem(command, self.gpu), "#run-command"),
                               (not self.remote and directory_problem(cwd), "#run-cwd"),
                               (limit and size_problem(limit, self.gpu), "#run-limit")):
            if problem:
                error.update(Text(problem))
                self.query_one(field, Input).focus()
                return None
        return RunChoice(
            command=command, cwd=cwd, mem_limit=limit,
            numa=self.query_one("#run-numa", Checkbox).value,
            foreground=self.query_one("#run-foreground", Checkbox).value,
            wait=self.query_one("#run-wait", Checkbox).value,
            failover=DIALOG_FAILOVER if self.query_one("#run-failover", Checkbox).value else 0,
        )

    def _launch(self) -> None:
        choice = self._choice()
        if choice is not None:
            self.dismiss(choice)

    def action_submit(self) -> None:
        self._launch()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._launch()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "run-launch":
            self._launch()
        else:
            self.dismiss(None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class MemLimitDialog(ModalScreen[str | None]):
    """Returns the SIZE typed, "" to remove the default, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, gpu: GpuSample, current: int | None, where: str | None = None) -> None:
        super().__init__()
        self.gpu = gpu
        self.current = current
        self.where = where or f"GPU {gpu.index}"

    def compose(self) -> ComposeResult:
        with Vertical(id="limit-body") as body:
            body.border_title = Text(f"Memory limit for jobs on {self.where}")
            body.border_subtitle = "Enter saves · empty removes · Esc cancels"
            yield Label(f"Card total {format_bytes(self.gpu.memory_total)}. Jobs launched here are stopped by "
                        "the watchdog above this, and JAX/PyTorch are capped to it.")
            yield Input(format_bytes(self.current, na="") if self.current else "", placeholder="e.g. 20G or 25%",
                        id="limit-value")
            yield Static("", id="limit-error")

    def on_mount(self) -> None:
        self.set_focus(self.query_one(Input))  # at once, as the run dialog's

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if value and (problem := size_problem(value, self.gpu)):
            self.query_one("#limit-error", Static).update(Text(problem))
            return
        self.dismiss(value)

    def action_cancel(self) -> None:
        self.dismiss(None)
