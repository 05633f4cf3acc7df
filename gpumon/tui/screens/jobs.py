"""`J`: the jobs gpumon launched, with the selected job's log following below.

The list comes from the screen's host (jobs/host.py `Host.jobs()`: the fields of `gpumon jobs
--json`, as the fleet's J reads them from every host); for this machine, a `LocalHost`, that is read
in this process, cheap enough for once a second. The log is the job's file here, tailed.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Log, Static

from gpumon.errors import GpumonError
from gpumon.jobs.attempts import Attempt, describe
from gpumon.tui.background import in_background
from gpumon.tui.plain import plain, plain_lines
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.units import format_bytes, format_energy, format_runtime

if TYPE_CHECKING:
    from gpumon.jobs.host import Host

LOG_TAIL_BYTES = 64 * 1024
STATE_STYLES = {"running": "bold green", "queued": "bold yellow", "exited": "", "killed": "bold red",
                "failed": "bold red", "cancelled": "dim", "lost": "red"}
READONLY_STOP = "read-only (--readonly): jobs are not stopped from here"
UNFINISHED = ("running", "queued")


def state_text(job: dict) -> Text:
    """The state for people: an unfinished job that runs on another host sharing this home says where."""
    elsewhere = f" on {job['runs_on']}" if job.get("runs_on") and job["state"] in UNFINISHED else ""
    return Text(job["state"] + elsewhere, style=STATE_STYLES.get(job["state"], ""))


def runtime(job: dict) -> float | None:
    """Seconds the command has run (until now if it still runs); None before it starts."""
    return None if job["started"] is None else (job["ended"] or time.time()) - job["started"]


def moves(job: dict) -> list[tuple[str, str]]:
    """A job that has moved (`--failover`): each of its attempts, a line each."""
    attempts = [a for a in job.get("attempts", []) if a["attempt"] is not None and a["started"] is not None]
    if len(attempts) < 2:
        return []
    return [("\n" + plain_lines(describe(Attempt.from_dict(a))), "") for a in attempts]


def _cut(text: str, cells: int) -> Text:
    cut = plain(text)
    cut.truncate(cells, overflow="ellipsis")
    return cut


class LogTail:
    """Reads what was appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read_new(self) -> str:
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                if self.offset == 0 and size > LOG_TAIL_BYTES:
                    self.offset = size - LOG_TAIL_BYTES
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return ""
        self.offset += len(data)
        return data.decode(errors="replace")


class JobsScreen(ModalScreen[str | None]):
    """Dismisses with a job id when the user asks to see its processes."""

    BINDINGS = [
        Binding("escape,q,J", "close", "Close"),
        Binding("s", "stop", "Stop job"),
        Binding("p", "processes", "Its processes"),
    ]

    def __init__(self, host: Host) -> None:
        super().__init__()
        self.host = host  # this machine, acted on as the fleet acts on a host (list, stop)
        self.jobs: list[dict] = []
        self.problem: str | None = None
        self.tail: LogTail | None = None
        self.tail_id: str | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="jobs-body") as body:
            body.border_title = "Jobs"
            body.border_subtitle = ("read-only: s is off · " if self.app.readonly else "s stop · ") \
                + "p its processes · Esc close"
            yield DataTable(cursor_type="row", id="jobs-table")
            yield Static("", id="jobs-detail")
            yield Log(id="jobs-log", max_lines=2000)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in [("id", "ID"), ("name", "NAME"), ("state", "STATE"), ("gpu", "GPU"), ("pid", "PID"),
                           ("exit", "EXIT"), ("runtime", "RUNTIME"), ("peak", "PEAK MEM"), ("limit", "LIMIT"),
                           ("energy", "ENERGY")]:
            table.add_column(label, key=key)
        self.refresh_jobs()
        self.set_interval(1.0, self.refresh_jobs)
        table.focus()

    @property
    def selected(self) -> dict | None:
        table = self.query_one(DataTable)
        if not self.jobs or table.cursor_row is None or table.cursor_row >= len(self.jobs):
            return None
        return self.jobs[table.cursor_row]

    def refresh_jobs(self) -> None:
        table = self.query_one(DataTable)
        cursor = table.cursor_row
        try:
            self.jobs, self.problem = list(reversed(self.host.jobs())), None  # newest on top
        except GpumonError as exc:  # the host could not say (HostError)
            self.problem = str(exc)
        table.clear()
        for job in self.jobs:
            exit_text = job["signal"] or ("" if job["exit_code"] is None else str(job["exit_code"]))
            table.add_row(
                plain(job["id"]), _cut(job["name"] or "", 24), state_text(job),
                ",".join(map(str, job["gpu_indices"])) or "-", str(job["pid"] or ""),
                plain(exit_text), format_runtime(runtime(job)),
                format_bytes(job["peak_gpu_memory"], na=""), format_bytes(job["mem_limit"], na=""),
                format_energy(job["energy_j"], job["energy_shared"]), key=job["id"],
            )
        if self.jobs:
            table.move_cursor(row=min(cursor or 0, len(self.jobs) - 1))
        self._show_selected()

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_selected()

    def _show_selected(self) -> None:
        job = self.selected
        detail = self.query_one("#jobs-detail", Static)
        log = self.query_one(Log)
        if job is None:
            detail.update(plain(self.problem, "bold red") if self.problem
                          else "No jobs yet: select a card and press r.")
            return
        said = plain(job["reason"], "bold red") if job["reason"] else plain(f"log: {job['log']}", "dim")
        detail.update(Text.assemble(("$ ", "dim"), plain(shlex.join(job["command"])), "\n", said, *moves(job)))
        if self.tail_id != job["id"]:
            self.tail_id, self.tail = job["id"], LogTail(Path(job["log"] or ""))
            log.clear()
        new = self.tail.read_new() if self.tail else ""
        if new:
            # The job's output as the fleet's log pane shows it: a training log's colour codes and
            # cursor moves made visible, so they never reach the terminal (Log passes ESC through).
            log.write(plain_lines(new))

    def action_stop(self) -> None:
        """Asks first, like signalling a process (`x`): stopping loses the job's unsaved work."""
        job = self.selected
        if job is None:
            return
        if self.app.readonly:
            self.notify(READONLY_STOP, severity="warning")
            return
        if job["state"] not in UNFINISHED:
            self.notify(f"job {job['id']} is {job['state']}, not running", severity="warning")
            return
        verb = "Cancel the queued" if job["state"] == "queued" else "Stop"
        question = f"{verb} job {job['name']} ({job['id']})?"
        running = job["state"] == "running"
        detail = "SIGTERM to its processes, SIGKILL after 5 s." if running else "It has not started yet."

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            in_background(self.app, lambda: self.host.stop(job["id"]), self._stopped,
                          lambda exc: self.notify(str(exc), severity="error"))

        self.app.push_screen(ConfirmScreen(question, f"{detail}\n$ {shlex.join(job['command'])}"), answered)

    def _stopped(self, output: str) -> None:
        self.notify(output)
        if self.is_attached:
            self.refresh_jobs()

    def action_processes(self) -> None:
        job = self.selected
        if job is not None:
            self.dismiss(job["id"])

    def action_close(self) -> None:
        self.dismiss(None)
