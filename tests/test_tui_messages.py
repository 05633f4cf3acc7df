"""Readings reach the TUI's screens as messages (tui/messages.py): a backlog collapses into the
newest, the main screen, the users view, a process screen, the fleet overview and a host's view
each receive them, and a screen behind another is sent none it would not draw."""

from __future__ import annotations

import asyncio

from fleet_scenes import card, machine
from test_fleet_tui import a_lab, drawn, overview
from test_tui import started
from test_tui_dialogs import wait_until
from textual._context import active_message_pump
from textual.app import App
from textual.screen import Screen

from gpumon.alerting.rules import parse_rules
from gpumon.cards.backends.demo import DemoBackend
from gpumon.model import HostStatus
from gpumon.tui.app import create_app
from gpumon.tui.fleet.app import FleetApp
from gpumon.tui.fleet.host_screen import HostScreen
from gpumon.tui.messages import HostsReported, SnapshotArrived
from gpumon.tui.screens.process import ProcessScreen
from gpumon.tui.screens.users import UsersScreen
from gpumon.tui.widgets.process_table import ProcessTable

NOW = 1_767_225_600.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def received_by(kind: type) -> tuple[list, callable]:
    """A message hook that notes, for each message of `kind` handled, the screen that handled it."""
    seen: list[tuple[object, object]] = []

    def hook(message) -> None:
        if isinstance(message, kind):
            seen.append((active_message_pump.get(), message))

    return seen, hook


class Noting(Screen):
    def __init__(self) -> None:
        super().__init__()
        self.readings: list[SnapshotArrived] = []
        self.reports: list[HostsReported] = []

    def on_snapshot_arrived(self, message: SnapshotArrived) -> None:
        self.readings.append(message)

    def on_hosts_reported(self, message: HostsReported) -> None:
        self.reports.append(message)


class OneScreen(App):
    def on_mount(self) -> None:
        self.push_screen(Noting())


def test_a_backlog_of_readings_is_handled_once_with_the_newest_and_hosts_are_merged_not_lost():
    async def go():
        async with OneScreen().run_test() as pilot:
            screen = pilot.app.screen
            assert isinstance(screen, Noting)
            snapshots = [machine("h", [card(0, util=u)], time=NOW + u) for u in (1, 2, 3)]
            for snapshot in snapshots:  # posted before the screen gets a turn: a backlog
                screen.post_message(SnapshotArrived(snapshot, {0: (f"rule {snapshot.time}",)}))
            await pilot.pause()
            assert [m.snapshot for m in screen.readings] == [snapshots[-1]]
            assert screen.readings[0].alerts == {0: (f"rule {NOW + 3}",)}  # the newest's, with it

            a1, b, a2 = HostStatus("a", "live"), HostStatus("b", "unreachable"), HostStatus("a", "stale")
            for statuses in ({"a": a1}, {"b": b}, {"a": a2}):
                screen.post_message(HostsReported(statuses))
            await pilot.pause()
            assert len(screen.reports) == 1 and screen.reports[0].statuses == {"a": a2, "b": b}

            screen.post_message(SnapshotArrived(snapshots[0]))  # one at a time: each is handled
            await pilot.pause()
            screen.post_message(SnapshotArrived(snapshots[1]))
            await pilot.pause()
            assert [m.snapshot for m in screen.readings[1:]] == snapshots[:2]

    run(go())


def test_this_machines_readings_reach_the_main_screen_users_view_and_process_screen_as_messages():
    seen, hook = received_by(SnapshotArrived)

    def to(screen) -> list[SnapshotArrived]:
        return [message for receiver, message in seen if receiver is screen]

    async def go():
        app = create_app(DemoBackend("hot"), interval=0.1, rules=parse_rules(["temp > 85"]))
        async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
            main = await started(pilot)
            await wait_until(pilot, lambda: 0 in app.engine.firing(), what="the rule firing")
            await wait_until(pilot, lambda: 0 in main.alerts, what="the alert on the main screen")
            # What it shows and the alerts on its cards are those of the newest reading it was sent.
            assert main.snapshot is to(main)[-1].snapshot and main.alerts is to(main)[-1].alerts

            await pilot.press("u")
            users = app.screen
            assert isinstance(users, UsersScreen)
            await wait_until(pilot, lambda: len(to(users)) >= 2, what="readings for the users view")
            await pilot.press("escape")
            await pilot.pause(0.1)
            hidden, shown = len(to(users)), len(to(main))
            await wait_until(pilot, lambda: len(to(main)) >= shown + 3, what="more readings")
            assert len(to(users)) == hidden  # behind: nothing sent; drawn when shown again

            await pilot.press("tab")
            assert isinstance(app.focused, ProcessTable)
            await pilot.press("enter")
            await wait_until(pilot, lambda: isinstance(app.screen, ProcessScreen), what="the process screen")
            process = app.screen
            await wait_until(pilot, lambda: len(to(process)) >= 2, what="readings for the process screen")

    run(go())


def test_the_fleets_hosts_reach_the_overview_and_a_hosts_view_as_messages():
    seen, hook = received_by(HostsReported)
    fleet, report = a_lab()

    def to(screen) -> list[HostsReported]:
        return [message for receiver, message in seen if receiver is screen]

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
            screen, _ = await overview(pilot)
            report()
            await drawn(pilot)
            told = {host for message in to(screen) for host in message.statuses}
            assert told == {"gpu01", "gpu02", "gpu03", "dgx-a", "old-box"}
            # Five hosts reported at once: one message, one frame (not one per host).
            assert len(to(screen)) == 1

            await pilot.press("enter")
            host = app.screen
            assert isinstance(host, HostScreen) and host.host == "gpu01"
            fleet.report("gpu02", "live", snapshot=machine("gpu02", [card(0, host="gpu02")], time=NOW + 1))
            fleet.report("gpu01", "live", snapshot=machine("gpu01", [card(0, util=12, host="gpu01"),
                                                                      card(1, util=34, host="gpu01")], time=NOW + 1))
            await wait_until(pilot, lambda: bool(to(host)), what="gpu01's news in its view")
            assert all(set(message.statuses) == {"gpu01"} for message in to(host))
            await wait_until(pilot, lambda: [p.gpu.utilization_gpu for p in host.query("GpuPanel")] == [12, 34],
                             what="the new values drawn")
            # The overview, behind, is still told of gpu02, and draws it when shown again.
            await wait_until(pilot, lambda: "gpu02" in {h for m in to(screen)[1:] for h in m.statuses},
                             what="gpu02's news for the overview")
            assert screen.undrawn
            await pilot.press("escape")
            await drawn(pilot)

    run(go())
