"""`J` with many hosts: the jobs of every host (a HOST column), the selected job's log following
below (`gpumon jobs --log ID --follow` on its host), `s` to stop it there (after a confirmation),
`p` to see its processes in that host's view.

The lists are read from each host's gpumon in background threads, many hosts at once, and again
every few seconds while the screen is open (less often for big fleets: each read starts gpumon on
the host). Hosts that cannot answer now (away, or without gpumon) are named, not waited for.
"""

from __future__ import annotations

import shlex
import subprocess
import threading

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Log, Static

from gpumon.errors import GpumonError
from gpumon.fleet import Fleet
from gpumon.jobs.host import host_for, jobs_of
from gpumon.sanitize import printable
from gpumon.tui.background import in_background
from gpumon.tui.fleet_actions import why_not_here
from gpumon.tui.plain import plain_lines
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.screens.jobs import READONLY_STOP, moves, runtime, state_text
from gpumon.units import format_bytes, format_runtime

LONG_LINE = 4096  # bytes of one log line held before they are shown as a line of their own
COLUMNS = [("host", "HOST"), ("id", "ID"), ("name", "NAME"), ("state", "STATE"), ("gpu", "GPU"), ("pid", "PID"),
           ("exit", "EXIT"), ("runtime", "RUNTIME"), ("peak", "PEAK MEM"), ("limit", "LIMIT")]


def list_jobs(fleet: Fleet, hosts: list[str]) -> tuple[list[dict], list[str]]:
    """Every job of these hosts, newest first, and a line per host that could not say."""
    rows, errors = jobs_of([host_for(fleet, name) for name in hosts])
    rows.sort(key=lambda job: job["id"], reverse=True)  # ids begin with their date and time
    return rows, [str(error) for error in errors]


def _cut(text: str | None, cells: int) -> Text:
    cut = Text(text or "")
    cut.truncate(cells, overflow="ellipsis")
    return cut


class FleetJobsScreen(ModalScreen[tuple[str, str] | None]):
    """Dismisses with (host, job id) when the user asks to see the job's processes."""

    BINDINGS = [
        Binding("escape,q,J", "close", "Close"),
        Binding("s", "stop", "Stop job"),
        Binding("p", "processes", "Its processes"),
    ]

    def __init__(self, fleet: Fleet) -> None:
        super().__init__()
        self.fleet = fleet
        self.jobs: list[dict] = []
        self.problems: list[str] = []
        self.refresh_s = max(5.0, len(fleet.names) / 8)
        self._listing = False
        self._follower: subprocess.Popen[bytes] | None = None
        self._following: tuple[str, str] | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="jobs-body") as body:
            body.border_title = "Jobs on every host"
            body.border_subtitle = ("read-only: s is off · " if self.app.readonly else "s stop · ") \
                + "p its processes · Esc close"
            yield DataTable(cursor_type="row", id="jobs-table")
            yield Static("reading the hosts' jobs…", id="jobs-detail")
            yield Log(id="jobs-log", max_lines=2000)

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for key, label in COLUMNS:
            table.add_column(label, key=key)
        self.list_jobs()
        self.set_interval(self.refresh_s, self.list_jobs)
        table.focus()

    def on_unmount(self) -> None:
        self._stop_following()

    # -- the lists --

    def list_jobs(self) -> None:
        if self._listing:
            return
        asked, away = [], []
        for status in self.fleet.statuses():
            problem = why_not_here(status, "listing jobs")
            if problem:
                away.append(problem)
            elif status.state not in ("live", "stale"):
                away.append(f"{status.host}: {status.state}" + (f" ({status.error})" if status.error else ""))
            else:
                asked.append(status.host)
        self._listing = True

        def done(result: tuple[list[dict], list[str]]) -> None:
            self._listing = False
            if self.is_attached:
                self._show(result[0], away + result[1])

        def failed(exc: Exception) -> None:
            self._listing = False
            self.notify(f"jobs not read: {exc}", severity="error")

        in_background(self.app, lambda: list_jobs(self.fleet, asked), done, failed)

    def _show(self, rows: list[dict], problems: list[str]) -> None:
        table = self.query_one(DataTable)
        selected = self.selected
        self.jobs, self.problems = rows, problems
        table.clear()
        for job in rows:
            exit_text = job["signal"] or ("" if job["exit_code"] is None else str(job["exit_code"]))
            # A str cell is markup to a DataTable: every word from the host is a Text.
            table.add_row(
                _cut(job["host"], 20), Text(job["id"]), _cut(job["name"], 24),
                state_text(job),
                ",".join(str(i) for i in job["gpu_indices"]) or "-", str(job["pid"] or ""), Text(exit_text),
                format_runtime(runtime(job)), format_bytes(job["peak_gpu_memory"], na=""),
                format_bytes(job["mem_limit"], na=""), key=f"{job['host']}\0{job['id']}",
            )
        if selected is not None:
            keys = [(j["host"], j["id"]) for j in rows]
            if (selected["host"], selected["id"]) in keys:
                table.move_cursor(row=keys.index((selected["host"], selected["id"])))
        self._show_selected()

    @property
    def selected(self) -> dict | None:
        table = self.query_one(DataTable)
        if not self.jobs or table.cursor_row is None or table.cursor_row >= len(self.jobs):
            return None
        return self.jobs[table.cursor_row]

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_selected()

    def _show_selected(self) -> None:
        job = self.selected
        detail = self.query_one("#jobs-detail", Static)
        unlisted = Text("\n".join(f"not listed: {p}" for p in self.problems[:3])
                        + (f"\n… and {len(self.problems) - 3} more" if len(self.problems) > 3 else ""),
                        style="dim")
        if job is None:
            detail.update(Text.assemble("No jobs on the hosts that answered: select a card and press r.\n",
                                        unlisted))
            return
        said = (job["reason"], "bold red") if job["reason"] else (f"log on {job['host']}: {job['log']}", "dim")
        detail.update(Text.assemble(("$ ", "dim"), shlex.join(job["command"]), "\n", said, *moves(job),
                                    "\n" if self.problems else "", unlisted))
        if self._following != (job["host"], job["id"]):
            self._follow(job["host"], job["id"])

    # -- the selected job's log, as its host sends it --

    def _follow(self, host: str, job_id: str) -> None:
        self._stop_following()
        log = self.query_one(Log)
        log.clear()
        self._following = (host, job_id)
        try:
            follower = host_for(self.fleet, host).follow_log(job_id)
        except (OSError, GpumonError) as exc:
            log.write_line(f"[{host}: cannot follow the log: {getattr(exc, 'strerror', None) or exc}]")
            return
        self._follower = follower
        key = self._following

        def show(text: str) -> None:
            if self._following == key and self.is_attached:
                log.write(text)

        def pump() -> None:
            """The job's output is untrusted: each line made printable before it is shown."""
            pending = b""
            while chunk := follower.stdout.read1(65536):  # type: ignore[union-attr]
                pending += chunk
                lines = pending.split(b"\n")
                pending = lines.pop()
                if len(pending) >= LONG_LINE:  # a line with no end in sight: shown in pieces, not gathered
                    lines.append(pending)
                    pending = b""
                if lines:
                    self._deliver(show, "".join(plain_lines(line.decode(errors="replace")) + "\n" for line in lines))
            if pending:
                self._deliver(show, plain_lines(pending.decode(errors="replace")) + "\n")
            code = follower.wait()
            if code not in (0, -9, -15):  # ours to end: killed when another job is selected
                why = printable(follower.stderr.read(4096).decode(errors="replace").strip())  # type: ignore[union-attr]
                self._deliver(show, f"[{host}: the log could not be followed ({why or f'status {code}'})]\n")

        threading.Thread(target=pump, name="gpumon-log", daemon=True).start()

    def _deliver(self, show, text: str) -> None:
        try:
            self.app.call_from_thread(show, text)
        except RuntimeError:  # the app ended
            pass

    def _stop_following(self) -> None:
        follower, self._follower, self._following = self._follower, None, None
        if follower is not None and follower.poll() is None:
            follower.kill()  # the remote tail ends with its connection

    # -- keys --

    def action_stop(self) -> None:
        job = self.selected
        if job is None:
            return
        if self.app.readonly:
            self.notify(READONLY_STOP, severity="warning")
            return
        if job["state"] not in ("running", "queued"):
            self.notify(f"job {job['id']} on {job['host']} is {job['state']}, not running", severity="warning")
            return
        verb = "Cancel the queued" if job["state"] == "queued" else "Stop"
        question = f"{verb} job {job['name']} ({job['id']}) on {job['host']}?"
        running = job["state"] == "running"
        detail = "SIGTERM to its processes, SIGKILL after 5 s." if running else "It has not started yet."
        def stopped(message: str) -> None:
            self.notify(f"{job['host']}: {message}")
            if self.is_attached:
                self.list_jobs()

        def answered(yes: bool | None) -> None:
            if yes:
                in_background(self.app, lambda: host_for(self.fleet, job["host"]).stop(job["id"]), stopped,
                              lambda exc: self.notify(str(exc), severity="error"))

        self.app.push_screen(ConfirmScreen(question, f"{detail}\n$ {shlex.join(job['command'])}"), answered)

    def action_processes(self) -> None:
        job = self.selected
        if job is not None:
            self.dismiss((job["host"], job["id"]))

    def action_close(self) -> None:
        self.dismiss(None)
