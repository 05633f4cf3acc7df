"""The Textual app: owns the sampler and the themes, and hands snapshots to the main screen.

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
import signal
import time
from collections.abc import Callable, Mapping

from rich.color import ColorSystem
from rich.console import RenderableType
from textual.app import App
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import WorkerFailed

from gpumon.alerting.rules import AlertEngine, AlertEvent, Rule, missing_cards
from gpumon.errors import EXIT_OK, GpumonError, UsageError
from gpumon.model import GpuSample, Snapshot
from gpumon.monitor.backends import Backend
from gpumon.monitor.recording import Recorder
from gpumon.monitor.sampler import Sampler
from gpumon.monitor.xid import RecentXids, XidListener
from gpumon.tui.plain import plain_lines
from gpumon.tui.screens.alerts import AlertsScreen
from gpumon.tui.screens.help import HelpScreen
from gpumon.tui.screens.main import MainScreen
from gpumon.tui.themes import DEFAULT, MONOCHROME, load_themes
from gpumon.tui.wire import updates
from gpumon.tui.wire.driver import LinkLag, WireDriver
from gpumon.tui.wire.guards import usable

log = logging.getLogger(__name__)
EXIT_INTERRUPTED = 128 + signal.SIGINT  # Ctrl-C, as a shell reports a command it interrupted
EXIT_TERMINATED = 128 + signal.SIGTERM
# The terminal this many seconds behind for this long: low-bandwidth mode switches on. (The first
# frames of a slow link take seconds on their own: that is no reason yet.)
AUTO_LOW_BANDWIDTH_S = 3
AUTO_LOW_BANDWIDTH_AFTER_S = 10.0
LOW_BANDWIDTH_REDRAW_S = 5.0  # how often the screen is redrawn in low-bandwidth mode


class GpumonApp(App[int]):
    CSS_PATH = "gpumon.tcss"
    TITLE = "gpumon"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        # Ctrl-C leaves, as in top or nvtop (Textual would only say to press q); a text field or a
        # selection takes it first, to copy.
        Binding("ctrl+c", f"quit({EXIT_INTERRUPTED})", "Quit", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("c", "next_theme", "Theme", show=False),
        Binding("exclamation_mark", "alerts", "Alerts", show=False),
        Binding("b", "toggle_low_bandwidth", "Low bandwidth", show=False),
        Binding("space", "replay_pause", "Pause"),
        Binding("full_stop", "replay_step", "Step"),
        Binding("plus", "replay_speed(2)", "Faster"),
        Binding("minus", "replay_speed(0.5)", "Slower"),
    ]

    def __init__(self, sampler: Sampler, *, readonly: bool = False, theme: str | None = None,
                 env: Mapping[str, str] | None = None, sample_count: int | None = None,
                 rules: list[Rule] | None = None, recorder: Recorder | None = None,
                 backend_args: dict | None = None, real_pids: bool = True, identity: Snapshot | None = None,
                 low_bandwidth: bool = False) -> None:
        """`real_pids`: whether the backend the sampler will open lists real processes (when the
        sampler has no backend yet); `identity`: the cards' names and ids, shown until the first sample."""
        # The output layer: only changed cells are sent, never faster than the terminal draws them.
        # Textual's own driver, and way of drawing, where this Textual is not the one they were written for.
        super().__init__(driver_class=WireDriver if usable("output layer") else None)
        self._cells = usable("compositor updates as cells", self, "_batch_count", "_running", "_closed", "_driver",
                             "console._color_system")
        # How launched jobs' supervisors reach the same driver; None: launching is not offered.
        self.backend_args = backend_args
        self.launch_cwd = os.getcwd()  # where `r` runs commands unless the user says otherwise
        self.sampler = sampler
        self.engine = AlertEngine(rules or [])
        self.alert_log: list[AlertEvent] = []
        self.recorder = recorder
        self.base_interval = sampler.interval
        self.readonly = readonly
        self.requested_theme = theme
        self.sample_count = sample_count
        self.theme_problems: list[str] = []
        self.theme_names: list[str] = []
        self.failure: GpumonError | None = None  # why the data source (or a rule's card) could not be used
        self._cards_checked = False
        self.crash: Exception | None = None  # a bug that ended the app (main() reports it in one line)
        # The first frame (cli/splash.py) already put the terminal on its alternate screen.
        self.on_alternate_screen = False
        self.recent_xids = RecentXids()
        self._xid_listener: XidListener | None = None
        opening = sampler.backend is None
        real_pids = sampler.backend.real_pids if sampler.backend is not None else real_pids
        self.main_screen = MainScreen(sampler.history, sampler.interval, real_pids, readonly, env,
                                      waiting="opening the NVIDIA driver…" if opening else "starting…",
                                      identity=identity)
        self.low_bandwidth = low_bandwidth  # redraw every LOW_BANDWIDTH_REDRAW_S, not every sample
        self._redrawn_at = float("-inf")
        self.link_behind = 0  # seconds the terminal is behind (from the output layer)
        self._slow_since: float | None = None  # since when it has been AUTO_LOW_BANDWIDTH_S behind

    def on_mount(self) -> None:
        self._quit_on_sigterm()
        self._install_themes()
        self.push_screen(self.main_screen)
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

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = True) -> None:
        """Every notification is text, never markup (`markup` is ignored): they quote hosts' answers,
        job records and other users' processes. Screens' and widgets' notify() come here too."""
        super().notify(plain_lines(message), title=plain_lines(title), severity=severity, timeout=timeout,
                       markup=False)

    def _handle_exception(self, error: Exception) -> None:
        """An error nothing in the app caught. Textual prints its traceback and lets run() return
        as if all went well; gpumon keeps the error and raises it once the terminal is restored
        (run_app), so the CLI ends with its one line for bugs and status 70 (a GpumonError that
        got this far keeps its own line and status)."""
        if self.crash is None:  # a failed worker's own error says what went wrong
            self.crash = error.error if isinstance(error, WorkerFailed) and isinstance(error.error, Exception) \
                else error
        super()._handle_exception(error)
        shown = getattr(self, "_exit_renderables", None)  # Textual's private list: a later one may lack it
        if isinstance(shown, list):
            shown.clear()  # the traceback: GPUMON_DEBUG=1 shows it, from the CLI

    def outcome(self, status: object) -> int:
        """The exit status once the app has ended and the terminal is restored; raises the error
        that ended it (a driver that cannot be used, a rule's missing card, a bug)."""
        if self.failure is not None:
            raise self.failure
        if self.crash is not None:
            raise self.crash
        if self.return_code not in (None, 0) and not isinstance(status, int):
            # Textual ended on an error without calling the override above (a Textual that renamed
            # it): still never a success.
            raise RuntimeError("the TUI stopped on an error (Textual's report is above)")
        return status if isinstance(status, int) else EXIT_OK

    def _on_xid(self, index: int, code: int, when: float) -> None:
        """An XID error: shown on its card's panel, and `xid` rules fire at once."""
        self.recent_xids.record(index, code, when)
        latest = self.sampler.latest
        gpu = next((g for g in latest.gpus if g.index == index), None) if latest else None
        events = self.engine.xid(gpu or GpuSample(index=index, uuid=None, name="?", pci_bus_id=None), code, when)
        self.alert_log = (self.alert_log + events)[-200:]
        self.notify(f"GPU {index}: XID {code}", title="XID error", severity="error", timeout=8)
        self.main_screen.alerts = self.engine.firing()
        if latest is not None and self.main_screen.is_attached:
            self.main_screen.show_snapshot(latest)

    def _quit_on_sigterm(self) -> None:
        """SIGTERM (kill, a logout, a service manager) leaves as `q` does: the terminal restored."""
        try:
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGTERM, lambda: self.call_later(self.run_action, f"quit({EXIT_TERMINATED})"))
        except (NotImplementedError, RuntimeError, ValueError):  # no signals here (not the main thread)
            pass

    def _handle_exception(self, error: Exception) -> None:
        """A bug: the app ends, the terminal is restored, and main() says so in one line (exit 70),
        instead of Textual's screenful of traceback and exit status 0."""
        if self.crash is None:
            self.crash = error
        super()._handle_exception(error)
        self._exit_renderables.clear()

    def _install_themes(self) -> None:
        """The shipped and the user's themes; the one asked for is applied, problems are notified."""
        themes, self.theme_problems = load_themes()
        for theme in themes:
            self.register_theme(theme)
        self.theme_names = [t.name for t in themes]
        self.theme = self._initial_theme()
        for problem in self.theme_problems:
            self.notify(problem, severity="warning", timeout=8)

    def _initial_theme(self) -> str:
        if self.no_color:
            return MONOCHROME
        if self.requested_theme is None:
            return DEFAULT
        if self.requested_theme not in self.available_themes:
            # Checked again here for themes from the user's directory; the CLI checks first.
            self.notify(f"unknown theme {self.requested_theme!r}; using {DEFAULT}", severity="warning")
            return DEFAULT
        return self.requested_theme

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        self._check_link()
        if not snapshot.stale and not self._cards_checked:  # rules naming cards that do not exist
            self._cards_checked = True
            if problem := missing_cards(self.engine.rules, snapshot):
                self.failure = UsageError(problem)
                self.exit(self.failure.exit_status)
                return
        if not snapshot.stale:
            if self.recorder is not None and (problem := self.recorder.write(snapshot)):
                self.notify(problem, severity="error", timeout=10)
            events = self.engine.evaluate(snapshot)
            self.alert_log = (self.alert_log + events)[-200:]
            for event in events:
                if event.event == "firing":
                    self.notify(f"GPU {event.gpu}: {event.rule}", title="Alert", severity="error", timeout=6)
            self.main_screen.alerts = self.engine.firing()
        if self.main_screen.is_attached and self._redraw_due():
            self.main_screen.show_snapshot(snapshot)

    def _display(self, screen: Screen, renderable: RenderableType | None) -> None:
        """Compositor updates go to the output layer as cells; Textual would make them one string
        of escape sequences that the output layer parses straight back (see wire/updates.py)."""
        driver = self._driver
        if not (self._cells and isinstance(driver, WireDriver) and driver.wired and updates.drawable(renderable)
                and not self._batch_count and self._running and not self._closed and not driver.is_inline):
            super()._display(screen, renderable)
            return
        try:
            self._begin_update()
            try:
                cursor = self.screen.outer_size.clamp_offset(self.cursor_position)
                driver.draw(renderable, cursor, self.console._color_system or ColorSystem.TRUECOLOR)
            except Exception as error:  # as Textual does with a frame that fails to render
                self._handle_exception(error)
            finally:
                self._end_update()
            driver.flush()
        finally:
            self.post_display_hook()

    def _redraw_due(self) -> bool:
        """Every sample; in low-bandwidth mode, every LOW_BANDWIDTH_REDRAW_S. (Until then the
        screen, and what keys act on, stay with the sample on it.)"""
        now = time.monotonic()
        if self.low_bandwidth and now - self._redrawn_at < LOW_BANDWIDTH_REDRAW_S:
            return False
        self._redrawn_at = now
        return True

    def on_link_lag(self, message: LinkLag) -> None:
        """The terminal is this far behind: a slow link (frames are being merged meanwhile)."""
        self.link_behind = message.seconds
        if message.seconds < AUTO_LOW_BANDWIDTH_S:
            self._slow_since = None
        elif self._slow_since is None:
            self._slow_since = time.monotonic()
        self._refresh_status()

    def _check_link(self) -> None:
        """Behind by seconds for a while (not just the first frames): redraw less often."""
        if (self._slow_since is not None and not self.low_bandwidth
                and time.monotonic() - self._slow_since >= AUTO_LOW_BANDWIDTH_AFTER_S):
            self.low_bandwidth = True
            self.notify(f"slow link ({self.link_behind} s behind): the screen now updates every "
                        f"{LOW_BANDWIDTH_REDRAW_S:g} s; b switches back", timeout=8)

    def action_toggle_low_bandwidth(self) -> None:
        self.low_bandwidth = not self.low_bandwidth
        self.notify(f"low bandwidth: the screen updates every {LOW_BANDWIDTH_REDRAW_S:g} s" if self.low_bandwidth
                    else "the screen updates every sample", timeout=3)
        self._refresh_status()

    def _refresh_status(self) -> None:
        if self.sampler.latest is not None and self.main_screen.is_attached:
            self.main_screen.show_snapshot(self.sampler.latest)

    def action_alerts(self) -> None:
        if not isinstance(self.screen, AlertsScreen):
            self.push_screen(AlertsScreen(self.engine, self.alert_log))

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
        notes = [self.replay_status()]
        if self.low_bandwidth:
            notes.append(f"low bandwidth: every {LOW_BANDWIDTH_REDRAW_S:g} s (b)")
        if self.link_behind >= 1:
            notes.append(f"link {self.link_behind} s behind")
        return "  ".join(n for n in notes if n)

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

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            if not self.is_screen_installed("help"):  # built once: opening it again costs no compose
                self.install_screen(HelpScreen(self.readonly), "help")
            self.push_screen("help")

    def action_next_theme(self) -> None:
        names = self.theme_names or [DEFAULT]
        current = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(current + 1) % len(names)]
        self.notify(f"theme: {self.theme}", timeout=2)

    async def action_quit(self, status: int = EXIT_OK) -> None:
        self.sampler.stop()
        self.exit(status)


def create_app(backend: Backend | None, *, interval: float = 1.0, readonly: bool = False, theme: str | None = None,
               env: Mapping[str, str] | None = None, sample_count: int | None = None,
               rules: list[Rule] | None = None, recorder: Recorder | None = None,
               backend_args: dict | None = None, opener: Callable[[], Backend] | None = None,
               identity: Snapshot | None = None, low_bandwidth: bool = False) -> GpumonApp:
    """The app over `backend`, or (backend None) over the backend `opener` makes, in a thread,
    once the first frame is up. An opener's backend lists real processes (NVML)."""
    return GpumonApp(Sampler(backend, interval=interval, opener=opener), readonly=readonly, theme=theme, env=env,
                     sample_count=sample_count, rules=rules, recorder=recorder, backend_args=backend_args,
                     identity=identity, low_bandwidth=low_bandwidth)


def _check_theme(name: str | None) -> None:
    if name is None:
        return
    themes, _ = load_themes()
    names = [t.name for t in themes]
    if name not in names:
        raise UsageError(f"unknown theme {name!r}; choose from {', '.join(names)}")


def prepare_terminal(args: argparse.Namespace, on_error: Callable[[], None]) -> None:
    """Before any app starts: the theme checked, colours and terminal size as the user's terminal
    says, logging kept off the screen."""
    try:
        _check_theme(args.theme)
    except UsageError:
        on_error()
        raise
    if args.no_color:
        os.environ["NO_COLOR"] = "1"  # Textual reads it when the app is created
    # Exported COLUMNS/LINES (shell rc files, CI) override the real terminal size in Textual and
    # freeze the layout at that size; the terminal itself knows better.
    os.environ.pop("COLUMNS", None)
    os.environ.pop("LINES", None)
    # Log lines on stderr would tear the screen; they go nowhere unless GPUMON_LOG asks for them.
    logging.getLogger().handlers.clear()
    if os.environ.get("GPUMON_LOG_FILE"):
        logging.basicConfig(filename=os.environ["GPUMON_LOG_FILE"], level=logging.INFO)


def run_app(args: argparse.Namespace, backend: Backend | None, rules: list[Rule] | None = None,
            backend_args: dict | None = None, opener: Callable[[], Backend] | None = None,
            on_error: Callable[[], None] = lambda: None, env: Mapping[str, str] | None = None,
            identity: Snapshot | None = None, on_alternate_screen: bool = False) -> int:
    """Run the TUI until it quits; `on_error` is called when it cannot start (a bad theme).
    `env`: the environment gpumon was started with (for CUDA ordinals and launched jobs), before
    the changes below; `on_alternate_screen`: the first frame already put the terminal there."""
    env = dict(os.environ if env is None else env)
    prepare_terminal(args, on_error)
    recorder = Recorder(args.record) if args.record else None
    app = create_app(backend, interval=args.interval, readonly=args.readonly, theme=args.theme,
                     rules=rules, recorder=recorder, backend_args=backend_args, opener=opener, env=env,
                     identity=identity, low_bandwidth=getattr(args, "low_bandwidth", False))
    app.on_alternate_screen = on_alternate_screen
    try:
        status = app.run()
    finally:
        if recorder is not None:
            recorder.close()
        if app.sampler.backend is not None:
            app.sampler.backend.close()
    return app.outcome(status)
