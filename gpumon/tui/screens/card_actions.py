"""What the main screen's keys do to cards and processes: launch a job on the selected card (`r`),
set its default memory limit (`m`), list jobs (`J`), signal a process (`x`/`X`/`i`), show its
environment (`e`). A mixin of MainScreen, kept apart so the screen module stays about showing data.

Launching, signalling and stopping go through `self.target`, this machine as a `LocalHost`
(jobs/host.py): its own `gpumon run` / `signal` / `jobs --stop` as a child process, exactly as the
fleet acts on its `local` host and on any other, so this view and the fleet's cannot drift apart.
(`target`, not `host`: a fleet host's view, a subclass, names its host `host`.)
"""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING

from gpumon.owners.containers import invisible_reason
from gpumon.tui.widgets.filter_box import FilterBox
from gpumon.tui.widgets.process_table import ProcessTable
from gpumon.units import format_bytes, parse_size

if TYPE_CHECKING:
    from gpumon.jobs.host import Host
    from gpumon.tui.screens.run_dialog import RunChoice

# The jobs' modules and the dialogs are imported when their key is first pressed: a start that
# only watches the cards never loads them (tests/test_lazy_imports.py).


class CardActions:
    """Needs from the screen: selected_gpu, snapshot, interval, env, only_selected, _job_pids."""

    # -- jobs --

    def action_run(self) -> None:
        from gpumon.jobs import command_history
        from gpumon.jobs.claims_and_queue import LaunchSharing
        from gpumon.jobs.launch import card_limits
        from gpumon.tui.screens.confirm import ConfirmScreen
        from gpumon.tui.screens.run_dialog import RunDialog, simulated_note

        gpu = self.selected_gpu
        if gpu is None or gpu.state != "ok":
            self.notify("select a working card first", severity="warning")
            return
        default = card_limits().get(gpu.ref)
        note = "" if self.real_pids else simulated_note(gpu)
        # Another job's claim (or someone's reservation): sharing the card is asked, then said in the dialog.
        sharing = LaunchSharing(self.app.sharing, lambda line: None)
        taken = sharing.taken_now()
        held = taken.others_on(gpu.ref or "")  # the user's own claim asks nothing: it is said
        ours = [f"job {c.job} {c.name}" for c in taken.claimed.get(gpu.ref or "", []) if c.uid == os.geteuid()]
        held_note = (f"{self.card_label(gpu)} is {held}; the job will share it." if held
                     else f"{self.card_label(gpu)} is yours: {', '.join(ours)}; the new job will share it." if ours
                     else "")
        place_note = sharing.shared_badly()  # the folder's owner can remove this job's claim

        def ask() -> None:
            self.app.push_screen(RunDialog(gpu, command_history.command_history(), default, self.app.launch_cwd,
                                           note="\n".join(n for n in (held_note, place_note, note) if n)),
                                 lambda choice: self._launch(gpu, choice) if choice else None)

        if held:
            self.app.push_screen(ConfirmScreen(f"{self.card_label(gpu)} is {held}.", "Run a job there anyway?"),
                                 lambda yes: ask() if yes else None)
        else:
            ask()

    @cached_property
    def target(self) -> Host:
        """This machine: its own gpumon, reading the cards as this one does, in the environment
        this gpumon was started with (not the one the TUI changed for itself: NO_COLOR, ...).
        Imported on first use: it brings the fleet's modules, which a single-machine start skips."""
        from gpumon.jobs.host import LocalHost, local_args

        return LocalHost(local_args(self.app.backend_args or {}), env=self.env)

    def _launch(self, gpu, choice: RunChoice) -> None:
        """The same launch as a fleet host's (tui/launching.py), on this machine, with this TUI's
        --interval for the job's own sampling."""
        from gpumon.jobs.logout import logout_note
        from gpumon.tui.launching import launch

        launch(self.app, self.target, gpu.ref, choice, self.card_label(gpu), interval=self.interval,
               launched=self._scan_jobs, note=lambda: logout_note(systemd=False))

    def card_label(self, gpu) -> str:
        """How messages name a card ("GPU 2"; a fleet host's view says "host:2")."""
        return f"GPU {gpu.index}"

    def action_mem_limit(self) -> None:
        """The card's default limit, kept here by its UUID: `r` fills it in (and a fleet host's
        view passes it to the host's gpumon as --mem-limit)."""
        from gpumon.jobs.launch import card_limits
        from gpumon.tui.screens.run_dialog import MemLimitDialog

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
        from gpumon.tui.jobs.host_list import HostJobs
        from gpumon.tui.jobs.screen import JobsScreen

        def closed(picked: tuple[str, str] | None) -> None:
            if picked:  # show that job's processes, on every card
                self.only_selected = False
                self.query_one("#filter", FilterBox).open(picked[1])

        self.app.push_screen(JobsScreen(HostJobs(self.target)), closed)

    def _selected_process(self):
        row = self.query_one(ProcessTable).selected_row
        if row is None:
            self.notify("no process selected", severity="warning", timeout=3)
        return row

    def action_signal(self, kind: str) -> None:
        row = self._selected_process()
        if row is not None:
            self.signal_process(row.process, kind)

    def signal_process(self, p, kind: str) -> None:
        """x, X, i on this process (the selected one, or the process screen's)."""
        from gpumon.jobs import processes as actions

        if p.user is None and p.command is None:
            self.notify(f"process {p.pid}: {invisible_reason()}", severity="warning")
            return
        if not actions.may_signal(p.uid):
            self.notify(f"not permitted: process {p.pid} belongs to {p.user}", severity="error")
            return
        confirm_signal(self.app, self.target, p, kind)

    def action_signal_menu(self) -> None:
        """F9: choose the signal, then the same checks and confirmation as x, X and i."""
        if self._signals_off():
            return
        row = self._selected_process()
        if row is not None:
            self.signal_menu_for(row.process)

    def signal_menu_for(self, process) -> None:
        if self._signals_off(process):
            return
        from gpumon.tui.screens.signal_menu import SignalMenu

        self.app.push_screen(SignalMenu(process.pid), lambda kind: self.signal_process(process, kind) if kind else None)

    def _signals_off(self, process=None) -> bool:
        """Whether signals cannot be sent here (read-only, or processes that are not real), said so."""
        if self.readonly:
            self.notify("signals are off: --readonly", severity="warning", timeout=3)
            return True
        if not self.real_pids:
            if process is None:
                self.action_not_real("nothing to signal")
            else:
                self.say_not_real(process, "nothing to signal")
            return True
        return False

    def action_not_real(self, why: str) -> None:
        """x, X, i or e where the processes are not real ones (demo, a recording): say so."""
        row = self._selected_process()
        if row is not None:
            self.say_not_real(row.process, why)

    def say_not_real(self, process, why: str) -> None:
        source = "--replay: process {} was recorded" if self.app.replay is not None else \
            "--demo: process {} is simulated"
        self.notify(f"{source.format(process.pid)}, {why}", severity="warning", timeout=4)

    def action_environment(self) -> None:
        row = self._selected_process()
        if row is not None:
            self.show_environment(row.process)

    def show_environment(self, process) -> None:
        from gpumon.jobs import processes as actions
        from gpumon.tui.screens.environment import EnvironmentScreen

        try:
            env = actions.environment(process.pid, process.started)
        except actions.ActionError as exc:
            self.notify(str(exc), severity="error")
            return
        self.app.push_screen(EnvironmentScreen(f"Environment of {process.pid}", env))


def confirm_signal(app, target: Host, process, kind: str, on: str = "") -> None:
    """Confirm, then signal the process through its host (`x`/`X`/`i` here and in a fleet host's
    view), whose gpumon checks it is the user's and still the same process. `on`: the host's
    name, said in the question and the answer, where there are many."""
    from gpumon.jobs import processes as actions
    from gpumon.tui.background import in_background
    from gpumon.tui.screens.confirm import ConfirmScreen

    where, prefix = (f" on {on}", f"{on}: ") if on else ("", "")

    def answered(yes: bool | None) -> None:
        if yes:
            in_background(app, lambda: target.signal(process.pid, process.started, kind),
                          lambda output: app.notify(prefix + output, timeout=5),
                          lambda exc: app.notify(str(exc), severity="error", timeout=8))

    question = f"Send {actions.SIGNALS[kind].name} to process {process.pid}{where}?"
    app.push_screen(ConfirmScreen(question, f"{process.user}: {(process.command or '')[:200]}"), answered)
