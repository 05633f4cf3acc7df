"""The TUI of this machine: a sampler reads its cards and the app posts each reading to the
screens that show it, as a message (tui/messages.py; what every gpumon TUI shares, themes, help,
the output layer, is base_app.py).

`create_app` is the one way to build it: the CLI, the tests and the screenshot script all use it.
The NVIDIA driver can take seconds to start on a sick machine, so the app may be given an
`opener` instead of a backend: the first frame is drawn at once ("opening the NVIDIA driver…")
and the backend is opened in a thread; a driver that cannot be used ends the app with its message.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from textual.binding import Binding
from textual.screen import Screen

from gpumon.alerting.rules import Rule, missing_cards
from gpumon.cards.backends import Backend
from gpumon.cards.process_history import ProcessHistory
from gpumon.cards.recording import Recorder
from gpumon.cards.sampler import Sampler
from gpumon.cards.xid_events import XidListener
from gpumon.errors import EXIT_OK, GpumonError, UsageError
from gpumon.model import GpuSample, Snapshot
from gpumon.owners.holders import Holder, HolderTracker
from gpumon.sharing.folder import SharingSettings
from gpumon.tui.base_app import BaseApp, prepare_terminal
from gpumon.tui.messages import SnapshotArrived
from gpumon.tui.preferences import PreferenceStore
from gpumon.tui.screens.main import MainScreen
from gpumon.tui.widgets.history_chart import WINDOWS

if TYPE_CHECKING:
    from gpumon.settings import Settings
    from gpumon.tui.screens.users import UsersScreen

log = logging.getLogger(__name__)


class GpumonApp(BaseApp):
    """This machine: a sampler reads its cards, the main screen shows them."""

    BINDINGS = [
        Binding("space", "replay_pause", "Pause"),
        Binding("full_stop", "replay_step", "Step"),
        Binding("plus", "replay_speed(2)", "Faster"),
        Binding("minus", "replay_speed(0.5)", "Slower"),
    ]

    def __init__(self, sampler: Sampler, *, readonly: bool = False, theme: str | None = None,
                 env: Mapping[str, str] | None = None, sample_count: int | None = None,
                 rules: list[Rule] | None = None, recorder: Recorder | None = None,
                 backend_args: dict | None = None, real_pids: bool = True, identity: Snapshot | None = None,
                 low_bandwidth: bool = False, preferences: PreferenceStore | None = None,
                 theme_given: bool = False, sharing: SharingSettings | None = None) -> None:
        """`real_pids`: whether the backend the sampler will open lists real processes (when the
        sampler has no backend yet); `identity`: the cards' names and ids, shown until the first
        sample; `sharing`: as BaseApp's."""
        # Who holds the cards, fed every reading from the start: idle time counts before `u` is
        # pressed. `idle` rules read the same tracker.
        holders = HolderTracker()
        super().__init__(readonly=readonly, theme=theme, rules=rules, low_bandwidth=low_bandwidth, holders=holders,
                         preferences=preferences, theme_given=theme_given, sharing=sharing)
        # How launched jobs' supervisors reach the same driver; None: launching is not offered.
        self.backend_args = backend_args
        self.sampler = sampler
        self.recorder = recorder
        self.base_interval = sampler.interval
        self.sample_count = sample_count
        self._cards_checked = False
        self._xid_listener: XidListener | None = None
        self.holders = holders
        self.holding: tuple[Holder, ...] = ()
        self.usage = None  # gpumon/usage's recorder (run_app gives it): who used the cards, kept
        self.users_screen: UsersScreen | None = None
        # Each process's recent past, for its screen (Enter): fed every fresh reading here, so a
        # reading the main screen never draws (collapsed into a newer one) still counts.
        self.process_history = ProcessHistory(seconds=max(WINDOWS))
        opening = sampler.backend is None
        real_pids = sampler.backend.real_pids if sampler.backend is not None else real_pids
        self.main_screen = MainScreen(sampler.history, sampler.interval, real_pids, readonly, env,
                                      waiting="opening the NVIDIA driver…" if opening else "starting…",
                                      identity=identity, process_history=self.process_history,
                                      sharing=self.sharing_now)

    def first_screen(self) -> Screen:
        return self.main_screen

    def start_source(self) -> None:
        self.sampler.subscribe(self._on_snapshot)
        self.run_worker(self._sample(), name="sampler", group="sampler")

    async def _sample(self) -> None:
        try:
            backend = await self.sampler.open()
            if XidListener.available(backend):
                self._xid_listener = XidListener(backend, self._on_xid)
                self._xid_listener.start(asyncio.get_running_loop())
            await self.sampler.run(self.sample_count)
        except GpumonError as exc:  # no usable driver: leave, and say why once the screen is restored
            self.failure = exc
            self.exit(exc.exit_status)
        finally:  # the worker is cancelled when the app exits
            if self._xid_listener is not None:
                self._xid_listener.stop()

    def _on_xid(self, index: int, code: int, when: float) -> None:
        """An XID error: shown on its card's panel, and `xid` rules fire at once."""
        self.recent_xids.record(index, code, when)
        latest = self.sampler.latest
        gpu = next((g for g in latest.gpus if g.index == index), None) if latest else None
        events = self.engine.xid(gpu or GpuSample(index=index, uuid=None, name="?", pci_bus_id=None), code, when)
        self.alert_log = (self.alert_log + events)[-200:]
        self.notify(f"GPU {index}: XID {code}", title="XID error", severity="error", timeout=8)
        if latest is not None:
            self._post(latest)

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        self._check_link()
        self.holding = self.holders.update(snapshot)
        if not snapshot.stale and not self._cards_checked:  # rules naming cards that do not exist
            self._cards_checked = True
            if problem := missing_cards(self.engine.rules, snapshot):
                self.failure = UsageError(problem)
                self.exit(self.failure.exit_status)
                return
        if not snapshot.stale:
            self.process_history.add(snapshot)
            if self.usage is not None:  # records only where no watch does; the writing is its thread's
                self.usage.feed(snapshot)
            if self.recorder is not None and (problem := self.recorder.write(snapshot)):
                self.notify(problem, severity="error", timeout=10)
            events = self.engine.evaluate(snapshot)
            self.alert_log = (self.alert_log + events)[-200:]
            for event in events:
                if event.event == "firing":
                    where = event.holder.label if event.holder is not None else f"GPU {event.gpu}"
                    self.notify(f"{where}: {event.rule}", title="Alert", severity="error", timeout=6)
        self.refresh_sharing(snapshot)
        if self.main_screen.is_attached and self._redraw_due():
            self._post(snapshot, users=True)
        if not snapshot.stale:
            self.settled()

    def _post(self, snapshot: Snapshot, users: bool = False) -> None:
        """The reading, with the rules firing now, to the main screen (which hands it on to a
        process screen it opened) and, with `users`, to the users view while it is the one shown."""
        if not self.main_screen.is_attached:
            return
        alerts = self.engine.firing()
        self.main_screen.post_message(SnapshotArrived(snapshot, alerts))
        if users and self.users_screen is not None and self.screen is self.users_screen:
            self.users_screen.post_message(SnapshotArrived(snapshot, alerts))

    def refresh_view(self) -> None:
        if self.sampler.latest is not None:
            self._post(self.sampler.latest)

    def open_users(self, host: str | None = None) -> None:
        """`u`: who holds the cards (one screen, kept: its sort and filter stay for the next time)."""
        if self.users_screen is None:
            from gpumon.tui.screens.users import UsersScreen  # on first use: a start does not load it

            self.users_screen = UsersScreen(lambda: self.holding, title=f"Users · {self.host_name()}",
                                            reservations=self.sharing_now)
            self.install_screen(self.users_screen, "users")
        if self.screen is not self.users_screen:
            self.push_screen("users")

    def host_name(self) -> str:
        latest = self.sampler.latest
        return latest.host if latest is not None else "this machine"

    def on_unmount(self) -> None:
        self.sampler.stop()

    @property
    def can_launch(self) -> bool:
        backend = self.sampler.backend
        return self.backend_args is not None and backend is not None and backend.name != "replay"

    # -- replay controls (only offered when playing back a recording) --

    @property
    def replay(self):
        backend = self.sampler.backend
        return backend if backend is not None and backend.name == "replay" else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action.startswith("replay_"):
            return self.replay is not None
        return True

    def status_note(self) -> str:
        """What the status line says beyond the sample: replay position, a slow link."""
        return "  ".join(n for n in (self.replay_status(), super().status_note()) if n)

    def replay_status(self) -> str:
        replay = self.replay
        if replay is None:
            return ""
        speed = self.base_interval / self.sampler.interval
        state = "  PAUSED (. steps)" if replay.paused else ""
        return f"{replay.position}/{len(replay.snapshots)}  ×{speed:g}{state}"

    def action_replay_pause(self) -> None:
        self.replay.paused = not self.replay.paused
        self._refresh_replay_status()

    def action_replay_step(self) -> None:
        if not self.replay.paused:
            self.replay.paused = True
        self.replay.step()
        self._refresh_replay_status()

    def action_replay_speed(self, factor: float) -> None:
        self.sampler.interval = min(10.0, max(0.05, self.sampler.interval / factor))
        self._refresh_replay_status()

    def _refresh_replay_status(self) -> None:
        self._refresh_status()

    async def action_quit(self, status: int = EXIT_OK) -> None:
        self.sampler.stop()
        self.exit(status)


def create_app(backend: Backend | None, *, interval: float = 1.0, readonly: bool = False, theme: str | None = None,
               env: Mapping[str, str] | None = None, sample_count: int | None = None,
               rules: list[Rule] | None = None, recorder: Recorder | None = None,
               backend_args: dict | None = None, opener: Callable[[], Backend] | None = None,
               identity: Snapshot | None = None, low_bandwidth: bool = False,
               preferences: PreferenceStore | None = None, theme_given: bool = False,
               settings: Settings | None = None) -> GpumonApp:
    """The app over `backend`, or (backend None) over the backend `opener` makes, in a thread,
    once the first frame is up. An opener's backend lists real processes (NVML). `preferences`:
    the choices kept from the last run (None: none kept); `theme_given`: `theme` wins over them;
    `settings`: the run's (None: the defaults)."""
    if settings is None:
        from gpumon.settings import Settings

        settings = Settings()
    return GpumonApp(Sampler(backend, interval=interval, opener=opener, owners=settings.host_paths), readonly=readonly,
                     theme=theme, env=env, sample_count=sample_count, rules=rules, recorder=recorder,
                     backend_args=backend_args, identity=identity, low_bandwidth=low_bandwidth,
                     preferences=preferences, theme_given=theme_given, sharing=settings.sharing)


def run_app(args: argparse.Namespace, backend: Backend | None, rules: list[Rule] | None = None,
            backend_args: dict | None = None, opener: Callable[[], Backend] | None = None,
            on_error: Callable[[], None] = lambda: None, env: Mapping[str, str] | None = None,
            identity: Snapshot | None = None, on_alternate_screen: bool = False, usage=None,
            settings: Settings | None = None) -> int:
    """Run the TUI until it quits; `on_error` is called when it cannot start (a bad theme).
    `settings`: the run's, built by the command line.
    `usage`: the usage ledger's recorder (gpumon/usage), fed the app's own HolderTracker.
    `env`: the environment gpumon was started with (for CUDA ordinals and launched jobs), before
    the changes below; `on_alternate_screen`: the first frame already put the terminal there."""
    env = dict(os.environ if env is None else env)
    prepare_terminal(args, on_error)
    recorder = Recorder(args.record) if args.record else None
    app = create_app(backend, interval=args.interval, readonly=args.readonly, theme=args.theme,
                     rules=rules, recorder=recorder, backend_args=backend_args, opener=opener, env=env,
                     identity=identity, low_bandwidth=getattr(args, "low_bandwidth", False),
                     preferences=PreferenceStore.load(), theme_given=getattr(args, "theme_given", False),
                     settings=settings)
    app.on_alternate_screen = on_alternate_screen
    if usage is not None:
        usage.tracker = app.holders  # the users view's: a sample's shares are worked out once
        app.usage = usage
    try:
        status = app.run()
    finally:
        if usage is not None:
            usage.close()
        if recorder is not None:
            recorder.close()
        if app.sampler.backend is not None:
            app.sampler.backend.close()
    return app.outcome(status)
