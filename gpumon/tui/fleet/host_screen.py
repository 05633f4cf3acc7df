"""One fleet host in the normal single-host view: the same main screen (panels, charts,
processes, `t`), fed from the host's statuses (posted by the app as `HostsReported`,
tui/messages.py) and `fleet.history(host)`; Esc (or ←) returns to the overview.

What acts on the host goes through its own gpumon (fleet/actions.py): `r` launches there, `x`/`X`/`i`
signal there (it checks the process is the user's and the same one), `t` reads its topology,
and the process table learns which pids are gpumon jobs from its job list. The status line names
the host as listed and says how it is doing (stale, unreachable with the reason and the retry
countdown, read through nvidia-smi); its old values stay on screen, marked "no new data".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence

from textual.binding import Binding
from textual.widgets import Static

from gpumon.cards.process_history import ProcessHistory
from gpumon.fleet import Fleet
from gpumon.jobs.host import host_for
from gpumon.model import GpuSample, HostStatus
from gpumon.owners.containers import invisible_reason
from gpumon.sharing.view import UseWithoutClaim
from gpumon.tui.background import in_background
from gpumon.tui.fleet.actions import ask_and_launch, ask_and_signal
from gpumon.tui.fleet.host_row import describe_state, time_dependent
from gpumon.tui.host_can_act import why_not_here
from gpumon.tui.literal_text import plain
from gpumon.tui.messages import HostsReported
from gpumon.tui.screens.main import MainScreen
from gpumon.tui.screens.topology import TopologyScreen
from gpumon.tui.widgets.card_list import CardList
from gpumon.tui.widgets.filter_box import FilterBox
from gpumon.tui.widgets.status_bar import StatusBar

log = logging.getLogger(__name__)
REMOTE_JOB_SCAN_S = 10.0  # a remote job list costs the host a gpumon start: not every few seconds


class HostScreen(MainScreen):
    local_sharing = False  # reservations are this machine's: not of the host shown
    BINDINGS = [
        Binding("escape", "clear_filter", "All hosts"),
        Binding("left", "back", "All hosts", show=False),
    ]

    def __init__(self, fleet: Fleet, host: str, real_pids: bool, readonly: bool,
                 env: Mapping[str, str] | None = None, selected: int = 0, *,
                 process_history: ProcessHistory) -> None:
        """`selected`: the card to select first (the one picked when the host was last open);
        `process_history`: the host's processes' recent past, fed by the app with each live reading."""
        self.fleet = fleet
        self.host = host
        self.status = fleet.status(host)
        self.local = fleet.specs[host].is_local
        super().__init__(fleet.history(host), fleet.interval, real_pids, readonly, env,
                         waiting=self._waiting(self.status), process_history=process_history)
        self._jobs_at = -REMOTE_JOB_SCAN_S
        self._jobs_busy = False
        self._away: Static | None = None  # says why there is no reading yet
        self._first_selected = selected

    def shared_words(self, gpu: GpuSample, unclaimed: Sequence[UseWithoutClaim] = ()) -> tuple[str, str]:
        """Who claims or reserved the card, as the host's own gpumon said it (its stream), in the
        words this machine's cards use; the user's own reservation there reads as theirs."""
        ref = gpu.ref or ""
        if ref in self.status.mine:
            return "reserved by you", "yours"
        words = dict(self.status.taken).get(ref, "")
        first = words.split("; ")[0]
        if first.startswith("reserved by "):
            return words, first.removeprefix("reserved by ") + "'s"
        return words, first.removeprefix("claimed by ").replace(": job ", ": ", 1)

    def on_mount(self) -> None:  # MainScreen's on_mount runs too (Textual calls every class's handler)
        self.cards.selected = self._first_selected  # kept (within the card count) when the panels come
        self.show_status(self.status)
        self.set_interval(1.0, self._tick)

    def show_job(self, job_id: str) -> None:
        """The processes of one of the host's jobs (`p` in the jobs list)."""
        self.only_selected = False
        self.query_one("#filter", FilterBox).open(job_id)
        self.rescan_jobs()

    # -- the host's news --

    def on_hosts_reported(self, message: HostsReported) -> None:
        status = message.statuses.get(self.host)
        if status is not None:
            self.show_status(status)

    def show_status(self, status: HostStatus) -> None:
        self.status = status
        snapshot = status.snapshot
        self._show_away(status if snapshot is None else None)
        if snapshot is None:
            return
        label = self.host if snapshot.host in ("", self.host) else f"{self.host} ({snapshot.host})"
        # Values of a host that is late or away are its last reading: the panels say "no new data".
        self.show_snapshot(dataclasses.replace(snapshot, host=label, stale=status.state != "live"))

    def _show_away(self, status: HostStatus | None) -> None:
        """Until the host's first reading: why there is none, where the cards will be."""
        if not self.is_attached or not self.children:  # not composed yet (on_mount runs before is_mounted)
            return
        if status is None:
            if self._away is not None:
                self._away.remove()
                self._away = None
            return
        text = self._waiting(status)
        bar = self.query_one(StatusBar)
        bar.waiting = text
        bar.refresh()
        if self._away is not None:
            self._away.update(plain(text))  # the host's own words (why its stream failed)
        else:
            self.query_one("#charts").display = False
            self._away = Static(plain(text), id="host-away")
            self.query_one(CardList).mount(self._away)

    def _waiting(self, status: HostStatus) -> str:
        state, _, note, _ = describe_state(status, time.time())
        return f"{self.host}: {state}" + (f" · {note}" if note else "")

    def status_extra(self) -> str:
        state, _, note, _ = describe_state(self.status, time.time())
        return note if self.status.state == "live" else state + (f": {note}" if note else "")

    def _tick(self) -> None:
        """Countdowns ("retry in 12s", "stale 40s") move with the clock alone."""
        if not time_dependent(self.status) or self.app.screen is not self:
            return
        if self.snapshot is None:
            self.show_status(self.status)
        else:
            alerts = sum(len(a) for a in self.alerts.values())
            self.query_one(StatusBar).show(self.snapshot, alerts=alerts, extra=self.status_extra())

    # -- keys --

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter")
        if box.display or self.filter_text:
            super().action_clear_filter()
        else:
            self.action_back()

    def action_back(self) -> None:
        self.app.close_host(self)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("run", "mem_limit"):
            return not self.readonly  # a host that cannot launch says why when asked
        if action == "environment":
            return self.real_pids
        return super().check_action(action, parameters)

    def action_run(self) -> None:
        gpu = self.selected_gpu
        if gpu is None:
            self.notify(f"{self.host}: no card to run on (yet)", severity="warning")
            return
        ask_and_launch(self.app, self.fleet, self.host, gpu, self.app.launch_cwd, launched=self.rescan_jobs)

    def rescan_jobs(self) -> None:
        """A job was launched here: which of the host's pids are jobs, asked now, not in 10 s."""
        self._jobs_at = -REMOTE_JOB_SCAN_S
        if self.is_attached:
            self._scan_jobs()

    def card_label(self, gpu) -> str:
        return self.status.card_id(gpu.index)

    def action_jobs(self) -> None:
        self.app.open_jobs()

    def signal_process(self, process, kind: str) -> None:
        if self.local and process.user is None and process.command is None:
            self.notify(f"process {process.pid}: {invisible_reason()}", severity="warning")
            return
        ask_and_signal(self.app, self.fleet, self.host, process, kind)

    def show_environment(self, process) -> None:
        if not self.local:
            self.notify(f"{self.host}: the environment of a process is shown for this machine's processes only",
                        severity="warning")
            return
        super().show_environment(process)

    def action_topology(self) -> None:
        problem = why_not_here(self.status, "reading the topology")
        if problem:
            self.notify(problem, severity="warning")
            return
        super().action_topology()

    async def _read_topology(self, screen: TopologyScreen) -> None:
        def failed(exc: Exception) -> None:
            screen.show_topology(screen.topo, False)
            self.notify(str(exc), severity="error", timeout=8)

        in_background(self.app, lambda: host_for(self.fleet, self.host).topology(),
                      lambda topo: screen.show_topology(topo, False), failed)

    # -- which processes are gpumon jobs --

    def _scan_jobs(self) -> None:
        if self.local:
            super()._scan_jobs()
            return
        now = time.monotonic()
        if self._jobs_busy or now - self._jobs_at < REMOTE_JOB_SCAN_S or self.status.state != "live" \
                or not self.status.can_launch:
            return
        self._jobs_busy, self._jobs_at = True, now

        def job_pids() -> dict[int, tuple[str, str]]:
            return {job["pid"]: (job["name"] or job["id"], job["id"]) for job in host_for(self.fleet, self.host).jobs()
                    if job["state"] == "running" and job["pid"] is not None}

        def done(found: dict[int, tuple[str, str]]) -> None:
            self._jobs_busy = False
            if self.is_attached:
                self._set_job_pids(found)

        def failed(exc: Exception) -> None:
            self._jobs_busy = False
            log.info("jobs of %s not read: %s", self.host, exc)

        in_background(self.app, job_pids, done, failed)
