"""`J`: the jobs gpumon launched, on one host or on every host of a fleet (a HOST column), the
selected job's log following below, `s` to stop it where it runs (after a confirmation), `p` to
see its processes.

Where the jobs come from is a job list (tui/jobs/host_list.py, tui/jobs/fleet_list.py): this
machine's or one host's (the fields of `gpumon jobs --json`, jobs/host.py `Host.jobs()`), or every
host's. The list is read in a
background thread and comes back to the screen as a message, again every `refresh_s` while the
screen is open; one read at a time (a pass that is due while one runs waits for it). The log is
followed in a thread of its own (tui/jobs/log_tail.py). Every word of a record or a host is shown as
text, never markup, with control characters made visible (tui/literal_text.py).
"""

from __future__ import annotations

import shlex
import time
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Log, Static

from gpumon.errors import GpumonError
from gpumon.jobs.attempts import Attempt, describe
from gpumon.sanitize import printable
from gpumon.tui.background import in_background
from gpumon.tui.literal_text import plain, plain_lines
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.widgets.host_queue import HostQueue
from gpumon.units import format_bytes, format_energy, format_runtime

if TYPE_CHECKING:
    from gpumon.tui.jobs.fleet_list import FleetJobs
    from gpumon.tui.jobs.host_list import HostJobs, Listing
    from gpumon.tui.jobs.log_tail import FileLog, HostLog

STATE_STYLES = {"running": "bold green", "queued": "bold yellow", "exited": "", "killed": "bold red",
                "failed": "bold red", "cancelled": "dim", "lost": "red", "unsupervised": "bold magenta"}
READONLY_STOP = "read-only (--readonly): jobs are not stopped from here"
UNFINISHED = ("running", "queued")
COLUMNS = [("host", "HOST"), ("id", "ID"), ("name", "NAME"), ("state", "STATE"), ("gpu", "GPU"), ("pid", "PID"),
           ("exit", "EXIT"), ("runtime", "RUNTIME"), ("peak", "PEAK MEM"), ("limit", "LIMIT"), ("energy", "ENERGY")]
ONE_HOST = {"host"}  # columns left out for one host
EVERY_HOST = {"energy"}  # and for a fleet (its table is wide enough as it is)
SHOWN_PROBLEMS = 3


def state_text(job: dict) -> Text:
    """The state for people: an unfinished job that runs on another host sharing this home says where;
    one whose supervisor is gone is `unsupervised` (its reason says what that means)."""
    state = "unsupervised" if job.get("supervised") is False else job["state"]
    elsewhere = f" on {job['runs_on']}" if job.get("runs_on") and job["state"] in UNFINISHED else ""
    return plain(state + elsewhere, STATE_STYLES.get(state, ""))


def runtime(job: dict) -> float | None:
    """Seconds the command has run (until now if it still runs); None before it starts."""
    return None if job["started"] is None else (job["ended"] or time.time()) - job["started"]


def moves(job: dict) -> list[tuple[str, str]]:
    """A job that has moved (`--failover`): each of its attempts, a line each."""
    attempts = [a for a in job.get("attempts", []) if a["attempt"] is not None and a["started"] is not None]
    if len(attempts) < 2:
        return []
    return [("\n" + plain_lines(describe(Attempt.from_dict(a))), "") for a in attempts]


def _cut(text: str | None, cells: int) -> Text:
    cut = plain(text)
    cut.truncate(cells, overflow="ellipsis")
    return cut


def cells(job: dict) -> dict[str, Text | str]:
    """A job's row, by column key: a str cell is markup to a DataTable, so every word from the
    record is a Text."""
    exit_text = job["signal"] or ("" if job["exit_code"] is None else str(job["exit_code"]))
    return {
        "host": _cut(job.get("host"), 20), "id": plain(job["id"]), "name": _cut(job["name"], 24),
        "state": state_text(job), "gpu": ",".join(map(str, job["gpu_indices"])) or "-",
        "pid": str(job["pid"] or ""), "exit": plain(exit_text), "runtime": format_runtime(runtime(job)),
        "peak": format_bytes(job["peak_gpu_memory"], na=""), "limit": format_bytes(job["mem_limit"], na=""),
        "energy": format_energy(job["energy_j"], job["energy_shared"]),
    }


class JobsScreen(ModalScreen[tuple[str, str] | None]):
    """Dismisses with (host, job id) when the user asks to see the job's processes."""

    BINDINGS = [
        Binding("escape,q,J", "close", "Close"),
        Binding("s", "stop", "Stop job"),
        Binding("p", "processes", "Its processes"),
    ]

    def __init__(self, jobs: HostJobs | FleetJobs) -> None:
        super().__init__()
        self.listing = jobs
        self.jobs: list[dict] = []
        self.problems: list[str] = []
        left_out = EVERY_HOST if jobs.hosts_column else ONE_HOST
        self.columns = [(key, label) for key, label in COLUMNS if key not in left_out]
        self.listed = False  # the first list is in
        self._reading = False
        self._read_again = False
        self._log: FileLog | HostLog | None = None
        self._following: tuple[str, str] | None = None
        self._after_first: list[str] = []  # actions asked for before the first list came

    @property
    def host(self):
        """The one host listed (None for a fleet)."""
        return getattr(self.listing, "host", None)

    def compose(self) -> ComposeResult:
        with Vertical(id="jobs-body") as body:
            body.border_title = self.listing.title
            body.border_subtitle = ("read-only: s is off · " if self.app.readonly else "s stop · ") \
                + "p its processes · Esc close"
            yield DataTable(cursor_type="row", id="jobs-table")
            if getattr(self.host, "name", None) == "local":  # this host's queue, every user's
                yield HostQueue(id="jobs-queue")
            yield Static("reading the jobs…" if self.listing.hosts_column else "", id="jobs-detail")
            yield Log(id="jobs-log", max_lines=2000)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in self.columns:
            table.add_column(label, key=key)
        self.read_jobs()
        self.set_interval(self.listing.refresh_s, self.read_jobs)
        table.focus()

    def on_unmount(self) -> None:
        self._stop_following()

    # -- the list --

    def read_jobs(self) -> None:
        """Asks for the list in the background; while a read runs, the next waits for it."""
        if self._reading:
            self._read_again = True
            return
        self._reading, self._read_again = True, False
        in_background(self.app, self.listing.read, self._listed, self._not_listed)

    def _listed(self, listing: Listing) -> None:
        self._reading = False
        if not self.is_attached:
            return
        rows, self.problems = listing
        if rows is not None:
            self._show(rows)
        else:
            self._show_selected()
        self._first_list_in()
        if self._read_again:
            self.read_jobs()

    def _not_listed(self, exc: Exception) -> None:
        self._reading = False
        if self.is_attached:
            self.notify(f"jobs not read: {printable(str(exc))}", severity="error")
            self._first_list_in()

    def _first_list_in(self) -> None:
        if not self.listed:
            self.listed = True
            for action in self._after_first:
                getattr(self, f"action_{action}")()
            self._after_first.clear()

    def _show(self, rows: list[dict]) -> None:
        table = self.query_one(DataTable)
        selected, cursor = self.selected, table.cursor_row
        self.jobs = rows
        table.clear()
        keys = [key for key, _ in self.columns]
        for job in rows:
            row = cells(job)
            table.add_row(*(row[key] for key in keys), key=f"{job['host']}\0{job['id']}")
        where = [(j["host"], j["id"]) for j in rows]
        if selected is not None and (selected["host"], selected["id"]) in where:
            table.move_cursor(row=where.index((selected["host"], selected["id"])))
        elif rows:
            table.move_cursor(row=min(cursor or 0, len(rows) - 1))
        self._show_selected()

    @property
    def selected(self) -> dict | None:
        table = self.query_one(DataTable)
        if not self.jobs or table.cursor_row is None or table.cursor_row >= len(self.jobs):
            return None
        return self.jobs[table.cursor_row]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_selected()

    def _unlisted(self) -> Text:
        problems = self.problems
        more = f"\n… and {len(problems) - SHOWN_PROBLEMS} more" if len(problems) > SHOWN_PROBLEMS else ""
        return plain_text("\n".join(f"not listed: {p}" for p in problems[:SHOWN_PROBLEMS]) + more, "dim")

    def _show_selected(self) -> None:
        job = self.selected
        detail = self.query_one("#jobs-detail", Static)
        fleet = self.listing.hosts_column
        if job is None:
            if fleet:
                detail.update(Text.assemble(self.listing.none + "\n", self._unlisted()))
            elif self.problems:
                detail.update(plain(self.problems[0], "bold red"))
            else:
                detail.update(self.listing.none)
            return
        where = f" on {job['host']}" if fleet else ""
        said = plain(job["reason"], "bold red") if job["reason"] else plain(f"log{where}: {job['log']}", "dim")
        unlisted = ("\n", self._unlisted()) if fleet and self.problems else ()
        detail.update(Text.assemble(("$ ", "dim"), plain(shlex.join(job["command"])), "\n", said, *moves(job),
                                    *unlisted))
        if self._following != (job["host"], job["id"]):
            self._follow(job)

    # -- the selected job's log --

    def _follow(self, job: dict) -> None:
        self._stop_following()
        log = self.query_one(Log)
        log.clear()
        key = self._following = (job["host"], job["id"])
        try:
            self._log = self.listing.log_of(job)
        except GpumonError as exc:  # a host the fleet can only read from afar
            log.write_line(f"[{printable(str(exc))}]")
            return

        def show(text: str) -> None:
            if self._following == key and self.is_attached:
                log.write(text)

        self._log.start(self.app, show)

    def _stop_following(self) -> None:
        following, self._log, self._following = self._log, None, None
        if following is not None:
            following.stop()

    # -- keys --

    def _when_listed(self, action: str) -> bool:
        """A key typed before the first list came (J s, quickly): it acts on that list."""
        if not self.listed:
            self._after_first.append(action)
        return not self.listed

    def action_stop(self) -> None:
        """Asks first, like signalling a process (`x`): stopping loses the job's unsaved work."""
        if self._when_listed("stop"):
            return
        job = self.selected
        if job is None:
            return
        if self.app.readonly:
            self.notify(READONLY_STOP, severity="warning")
            return
        where = f" on {job['host']}" if self.listing.hosts_column else ""
        if job["state"] not in UNFINISHED:
            self.notify(plain_lines(f"job {job['id']}{where} is {job['state']}, not running"), severity="warning")
            return
        verb = "Cancel the queued" if job["state"] == "queued" else "Stop"
        question = f"{verb} job {job['name']} ({job['id']}){where}?"
        running = job["state"] == "running"
        detail = "SIGTERM to its processes, SIGKILL after 5 s." if running else "It has not started yet."

        def stopped(message: str) -> None:
            self.notify(plain_lines(f"{job['host']}: {message}" if where else message))
            if self.is_attached:
                self.read_jobs()

        def answered(yes: bool | None) -> None:
            if yes:
                in_background(self.app, lambda: self.listing.host_of(job).stop(job["id"]), stopped,
                              lambda exc: self.notify(plain_lines(str(exc)), severity="error"))

        self.app.push_screen(ConfirmScreen(question, f"{detail}\n$ {shlex.join(job['command'])}"), answered)

    def action_processes(self) -> None:
        if self._when_listed("processes"):
            return
        job = self.selected
        if job is not None:
            self.dismiss((job["host"], job["id"]))

    def action_close(self) -> None:
        self.dismiss(None)


def plain_text(text: str, style: str) -> Text:
    """Several lines of our own making around words from elsewhere, each line made printable."""
    return Text(plain_lines(text), style=style)
