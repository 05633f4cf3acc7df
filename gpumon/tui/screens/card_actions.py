"""What the main screen's keys do to cards and processes: launch a job on the selected card (`r`),
set its default memory limit (`m`), list jobs (`J`), signal a process (`x`/`X`/`i`), show its
environment (`e`). A mixin of MainScreen, kept apart so the screen module stays about showing data.
"""

from __future__ import annotations

from textual.widgets import Input

from gpumon.errors import UsageError
from gpumon.jobs import launch
from gpumon.jobs import processes as actions
from gpumon.jobs import records as jobs
from gpumon.jobs.launch import card_limits, prepare, shell_request, start, summary
from gpumon.jobs.logout import logout_note
from gpumon.monitor.containers import invisible_reason
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.screens.environment import EnvironmentScreen
from gpumon.tui.screens.jobs import JobsScreen
from gpumon.tui.screens.run_dialog import SIMULATED_NOTE, MemLimitDialog, RunChoice, RunDialog
from gpumon.tui.widgets.process_table import ProcessTable
from gpumon.units import format_bytes, parse_size


class CardActions:
    """Needs from the screen: selected_gpu, snapshot, interval, env, only_selected, _job_pids."""

    # -- jobs --

    def action_run(self) -> None:
        gpu = self.selected_gpu
        if gpu is None or gpu.state != "ok":
            self.notify("select a working card first", severity="warning")
            return
        default = card_limits().get(gpu.ref)
        note = "" if self.real_pids else SIMULATED_NOTE
        self.app.push_screen(RunDialog(gpu, jobs.command_history(), default, self.app.launch_cwd, note=note),
                             lambda choice: self._launch(gpu, choice) if choice else None)

    def _launch(self, gpu, choice: RunChoice) -> None:
        request = shell_request(choice.command, gpu.ref, mem_limit=choice.mem_limit, numa=choice.numa,
                                foreground=choice.foreground, wait=choice.wait, cwd=choice.cwd,
                                failover=choice.failover)
        try:
            spec = prepare(request, self.snapshot, None, self.app.backend_args, self.interval)
            # The environment gpumon started with, not the one it changed for itself (NO_COLOR, ...).
            directory = start(spec, foreground=choice.foreground, typed=request.typed, env=self.env)
        except (UsageError, OSError) as exc:
            self.notify(str(exc), severity="error")
            return
        if choice.foreground:
            with self.app.suspend():
                launch.run_in_terminal(f"GPU {gpu.index}", choice.command,
                                       lambda: launch.run_foreground(directory, self.env),
                                       lambda code: launch.how_it_ended(directory, code))
            return
        self.run_worker(lambda: self._report_start(directory), thread=True, group="launch")

    def _report_start(self, directory) -> None:
        job = jobs.wait_until_started(directory)
        message = "\n".join(summary(job)) if job else f"job did not start: see {directory}"
        if job and (note := logout_note(systemd=False)):
            message += "\n" + note
        self.app.call_from_thread(self.notify, message, timeout=8)
        self._job_pids()

    def card_label(self, gpu) -> str:
        """How messages name a card ("GPU 2"; a fleet host's view says "host:2")."""
        return f"GPU {gpu.index}"

    def action_mem_limit(self) -> None:
        """The card's default limit, kept here by its UUID: `r` fills it in (and a fleet host's
        view passes it to the host's gpumon as --mem-limit)."""
        gpu = self.selected_gpu
        if gpu is None or gpu.ref is None:
            return
        card = self.card_label(gpu)

        def chosen(value: str | None) -> None:
            if value is None:
                return
            limit = parse_size(value, gpu.memory_total) if value else None
            card_limits().set(gpu.ref, limit)
            self.notify(f"{card}: jobs launched here are capped at {format_bytes(limit)}" if limit
                        else f"{card}: no default memory limit")

        self.app.push_screen(MemLimitDialog(gpu, card_limits().get(gpu.ref), where=card), chosen)

    def action_jobs(self) -> None:
        def closed(job_id: str | None) -> None:
            if job_id:  # show that job's processes, on every card
                self.only_selected = False
                box = self.query_one("#filter", Input)
                box.display = True
                box.value = job_id
                self.query_one(ProcessTable).focus()

        self.app.push_screen(JobsScreen(), closed)

    def _selected_process(self):
        row = self.query_one(ProcessTable).selected_row
        if row is None:
            self.notify("no process selected", severity="warning", timeout=3)
        return row

    def action_signal(self, kind: str) -> None:
        row = self._selected_process()
        if row is None:
            return
        p = row.process
        if p.user is None and p.command is None:
            self.notify(f"process {p.pid}: {invisible_reason()}", severity="warning")
            return
        if not actions.may_signal(p.uid):
            self.notify(f"not permitted: process {p.pid} belongs to {p.user}", severity="error")
            return
        signame = actions.SIGNALS[kind].name

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            try:
                self.notify(actions.send_signal(p.pid, p.started, kind), timeout=4)
            except actions.ActionError as exc:
                self.notify(str(exc), severity="error")

        self.app.push_screen(
            ConfirmScreen(f"Send {signame} to process {p.pid}?", f"{p.user}: {(p.command or '')[:200]}"), answered)

    def action_not_real(self, why: str) -> None:
        """x, X, i or e where the processes are not real ones (demo, a recording): say so."""
        row = self._selected_process()
        if row is None:
            return
        source = "--replay: process {} was recorded" if self.app.replay is not None else \
            "--demo: process {} is simulated"
        self.notify(f"{source.format(row.process.pid)}, {why}", severity="warning", timeout=4)

    def action_environment(self) -> None:
        row = self._selected_process()
        if row is None:
            return
        try:
            env = actions.environment(row.process.pid, row.process.started)
        except actions.ActionError as exc:
            self.notify(str(exc), severity="error")
            return
        self.app.push_screen(EnvironmentScreen(f"Environment of {row.process.pid}", env))
