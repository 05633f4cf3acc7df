"""The TUI over many hosts: the fleet overview first, each host's normal view one key away.

`FleetApp` is a peer of the single-host app on the same base (base_app.py: themes, help, quit,
the output layer, crash handling), with the fleet as its data source and the overview as its first
screen: `fleet.run()` runs as a worker on the app's loop, and the fleet's listener collects the
hosts it reports; every FRAME_S the app posts them to the overview (which repaints their rows),
and each at once to that host's view while it is open (a host's view is the single-host main
screen, fed by the fleet), as messages (`HostsReported`, tui/messages.py). Built only when hosts
are given: a single-machine `gpumon` never imports this module or the fleet.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Mapping

from textual.screen import Screen

from gpumon.cards.process_history import ProcessHistory
from gpumon.errors import EXIT_OK
from gpumon.fleet import Fleet
from gpumon.jobs.across_hosts import choose_across, taken_on
from gpumon.jobs.claims_and_queue import CardsTaken, LaunchSharing
from gpumon.jobs.placement import choose
from gpumon.model import HostStatus
from gpumon.owners.holders import Holder, HolderTracker
from gpumon.remote.children import end_all
from gpumon.sharing.folder import SharingSettings
from gpumon.tui.base_app import BaseApp, prepare_terminal
from gpumon.tui.fleet.actions import ask_and_launch
from gpumon.tui.fleet.host_screen import HostScreen
from gpumon.tui.fleet.overview import FleetScreen
from gpumon.tui.host_can_act import why_not_here
from gpumon.tui.jobs.fleet_list import FleetJobs
from gpumon.tui.jobs.screen import JobsScreen
from gpumon.tui.messages import HostsReported
from gpumon.tui.preferences import PreferenceStore
from gpumon.tui.screens.users import UsersScreen
from gpumon.tui.widgets.history_chart import WINDOWS

# How often the overview is posted the hosts that reported: their lines arrive spread over the
# interval, and drawn as they come, 256 hosts would cost 60 frames a second.
FRAME_S = 0.25


class FleetApp(BaseApp):
    def __init__(self, fleet: Fleet, *, readonly: bool = False, theme: str | None = None,
                 env: Mapping[str, str] | None = None, clock: Callable[[], float] = time.time,
                 local_real_pids: bool = True, preferences: PreferenceStore | None = None,
                 theme_given: bool = False, sharing: SharingSettings | None = None) -> None:
        """`local_real_pids`: whether the host `local` lists real processes (not --demo);
        `preferences`, `theme_given`: as GpumonApp's (the theme, and a host's view's process
        table and charts, share the single-machine TUI's saved choices); `sharing`: this machine's
        shared place, as BaseApp's."""
        super().__init__(readonly=readonly, theme=theme, preferences=preferences, theme_given=theme_given,
                         sharing=sharing)
        self.fleet = fleet
        self.env = dict(os.environ if env is None else env)
        self.local_real_pids = local_real_pids
        self.overview = FleetScreen(fleet, clock)
        self.host_screen: HostScreen | None = None
        self._host_history: ProcessHistory | None = None  # the processes' past of the host shown
        self._reported: dict[str, HostStatus] = {}  # for the overview's next frame
        # Each host's selected card while gpumon runs: `r` after reopening a host targets the card
        # picked a moment ago, not card 0.
        self.card_choice: dict[str, int] = {}
        # Who holds the cards of every host, fed by each host's readings as they come, one host at
        # a time: O(1) hosts a report.
        self.holders = HolderTracker()
        self.holding: dict[str, tuple[Holder, ...]] = {}
        self.users_screen: UsersScreen | None = None
        self._for_users: dict[str, HostStatus] = {}  # reported since the users view was last posted

    def first_screen(self) -> Screen:
        return self.overview

    def preferences_problem(self, problem: str) -> None:
        """The overview's top line has no room for notes: a notification says it (a host's view also shows it)."""
        super().preferences_problem(problem)
        self.notify(problem, severity="warning", timeout=8)

    def start_source(self) -> None:
        self.fleet.subscribe(self._on_host)
        self.run_worker(self.fleet.run(), name="fleet", group="fleet")

    def _on_host(self, status: HostStatus) -> None:
        if status.snapshot is not None and status.state in ("live", "stale"):
            self.holding[status.host] = self.holders.update(status.snapshot, status.host)
        else:  # away: who held its cards is no longer known
            self.holding.pop(status.host, None)
        self._for_users[status.host] = status
        self._reported[status.host] = status
        if status.state == "live":
            self.settled()
        screen = self.host_screen
        if screen is not None and screen.host == status.host:
            if status.state == "live" and status.snapshot is not None and self._host_history is not None:
                self._host_history.add(status.snapshot)
            if screen.is_attached:
                screen.post_message(HostsReported({status.host: status}))

    def _post_reported(self) -> None:
        if self._reported:
            reported, self._reported = self._reported, {}
            self.overview.post_message(HostsReported(reported))

    @property
    def undrawn(self) -> int:
        """News the overview has not drawn yet: hosts kept for its next frame, messages in its
        queue, hosts it keeps while behind another screen."""
        return len(self._reported) + self.overview.message_queue_size + self.overview.undrawn

    # -- a host's view --

    def open_host(self, name: str, job_id: str | None = None) -> None:
        """Its normal view; with `job_id`, showing that job's processes."""
        if self.host_screen is not None and self.screen is self.host_screen:
            self.close_host(self.host_screen)
        real_pids = self.local_real_pids if self.fleet.specs[name].is_local else True
        history = ProcessHistory(seconds=max(WINDOWS))
        status = self.fleet.status(name)
        if status.state == "live" and status.snapshot is not None:
            history.add(status.snapshot)
        screen = HostScreen(self.fleet, name, real_pids, self.readonly, self.env,
                            selected=self.card_choice.get(name, 0), process_history=history)
        self.host_screen, self._host_history = screen, history
        self.push_screen(screen)
        if job_id:
            screen.call_after_refresh(screen.show_job, job_id)

    def close_host(self, screen: HostScreen) -> None:
        self.card_choice[screen.host] = screen.cards.selected
        if self.screen is screen:
            self.pop_screen()
        if self.host_screen is screen:
            self.host_screen = self._host_history = None
        self.overview.table.select_host(screen.host)

    # -- who holds the cards --

    def open_users(self, host: str | None = None) -> None:
        """`u`: every host's holders (from a host's view: that host's)."""
        def holders() -> tuple[Holder, ...]:
            if host is not None:
                return self.holding.get(host, ())
            return tuple(h for name in self.fleet.names for h in self.holding.get(name, ()))

        self.users_screen = UsersScreen(holders, hosts=host is None,
                                        title=f"Users · {host}" if host else "Users · every host")
        self.push_screen(self.users_screen)

    def _post_users(self) -> None:
        """Hosts' readings arrive spread over the interval: the view is drawn with all of them, each second."""
        if self._for_users and self.users_screen is not None and self.screen is self.users_screen:
            reported, self._for_users = self._for_users, {}
            self.users_screen.post_message(HostsReported(reported))

    def on_mount(self) -> None:  # BaseApp's on_mount runs too (Textual calls every class's handler)
        self.set_interval(1.0, self._post_users)
        self.set_interval(FRAME_S, self._post_reported)

    # -- launching from the overview --

    def run_on_host(self, name: str) -> None:
        """`r` on a host's line: the run dialog for its least loaded free card."""
        status = self.fleet.status(name)
        problem = why_not_here(status)
        if problem:
            self.notify(problem, severity="warning", timeout=6)
            return
        if status.snapshot is None or status.state not in ("live", "stale"):
            self.notify(f"{name} is {status.state}: no reading to choose a card from", severity="warning")
            return
        try:
            taken, mine = taken_on(status, self._here())
            gpu = choose(status.snapshot, 1, taken=taken, preferred=mine).gpus[0]
        except ValueError as exc:
            held = [why for why in getattr(exc, "reasons", ()) if "claimed by" in why or "reserved by" in why]
            self.notify(f"{name}: no free card{': ' + held[0] if held else ''} (Enter shows its cards; R picks "
                        "the best free card anywhere)", severity="warning", timeout=6)
            return
        ask_and_launch(self, self.fleet, name, gpu, self.launch_cwd, why="its least loaded free card")

    def _here(self) -> CardsTaken:
        """This machine's claims and reservations, for the host `local` (unreadable: said, and none)."""
        return LaunchSharing(self.sharing, lambda line: self.notify(line, severity="warning", timeout=6)).taken_now()

    def run_anywhere(self) -> None:
        """`R`: the run dialog for the best free card of every host that can launch."""
        hosts = [s for s in self.fleet.statuses() if s.can_launch]
        best, _ = choose_across(hosts, 1, lambda host: None, here=self._here())
        if best is None:
            self.notify("no free card on any host that can launch", severity="warning", timeout=6)
            return
        self.overview.table.select_host(best.host)
        ask_and_launch(self, self.fleet, best.host, best.choice.gpus[0], self.launch_cwd,
                       why="the least loaded free card of the fleet")

    def open_jobs(self) -> None:
        def closed(picked: tuple[str, str] | None) -> None:
            if picked:
                self.open_host(*picked)

        self.push_screen(JobsScreen(FleetJobs(self.fleet)), closed)

    # -- ending --

    async def action_quit(self, status: int = EXIT_OK) -> None:
        # Nothing is waited for on the way out: the hosts' ssh are sent SIGTERM here (each remote
        # stream ends with its channel), a command still awaited is killed, and the streams'
        # tasks, cancelled as the app ends, end at once (children.end_all).
        end_all()
        self.fleet.stop()
        self.exit(status)

    def on_unmount(self) -> None:
        self.fleet.stop()


def run_fleet_app(args: argparse.Namespace, fleet: Fleet, on_error: Callable[[], None] = lambda: None,
                  env: Mapping[str, str] | None = None, on_alternate_screen: bool = False,
                  sharing: SharingSettings | None = None) -> int:
    """Run the fleet TUI until it quits (`gpumon --hosts …`); `on_alternate_screen`: as for run_app;
    `sharing`: the run's [claims]."""
    env = dict(os.environ if env is None else env)
    prepare_terminal(args, on_error)
    demo = bool(args.demo or args.scenario is not None)
    app = FleetApp(fleet, readonly=args.readonly, theme=args.theme, env=env, local_real_pids=not demo,
                   preferences=PreferenceStore.load(), theme_given=getattr(args, "theme_given", False),
                   sharing=sharing)
    app.on_alternate_screen = on_alternate_screen
    try:
        return app.outcome(app.run())
    finally:
        end_all()  # a host's answer still awaited (J's listing) holds up no exit
