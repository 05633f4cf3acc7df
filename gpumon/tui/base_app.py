"""What every gpumon TUI shares, whatever it reads: themes, help, quitting (q, Ctrl-C, SIGTERM),
the output layer (wire/) and low-bandwidth mode, notifications that never parse markup, and how a
crash or an unusable data source ends it (`outcome`).

Each app is a peer on this base with its own data source and first screen: `GpumonApp` (app.py)
reads this machine through a sampler and shows the main screen; `FleetApp` (fleet/app.py) reads
many hosts through a Fleet and shows the fleet overview. A subclass gives `first_screen()`, starts
its source in `start_source()` (on the app's loop, once the first screen is up) and stops it on
quit.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from rich.color import ColorSystem
from rich.console import RenderableType
from textual.actions import SkipAction
from textual.app import ScreenStackError
from textual.binding import Binding
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.worker import WorkerFailed

from gpumon.alerting.rules import AlertEngine, AlertEvent, Rule
from gpumon.errors import EXIT_OK, GpumonError, UsageError
from gpumon.health.xid import RecentXids
from gpumon.model import Snapshot
from gpumon.owners.holders import HolderTracker
from gpumon.sharing.folder import SharingSettings
from gpumon.sharing.view import SharingNow
from gpumon.tui.keys_one_at_a_time import KeysInTurn
from gpumon.tui.literal_text import plain_lines
from gpumon.tui.preferences import PreferenceStore
from gpumon.tui.themes import DEFAULT, MONOCHROME, load_themes
from gpumon.tui.wire import updates
from gpumon.tui.wire.driver import LinkLag, WireDriver
from gpumon.tui.wire.guards import usable
from gpumon.tui.wire.quiet_input import TerminalGone

EXIT_INTERRUPTED = 128 + signal.SIGINT  # Ctrl-C, as a shell reports a command it interrupted
EXIT_TERMINATED = 128 + signal.SIGTERM
EXIT_HANGUP = 128 + signal.SIGHUP  # the terminal went away, as a shell reports a command it hung up
# The terminal this many seconds behind for this long: low-bandwidth mode switches on. (The first
# frames of a slow link take seconds on their own: that is no reason yet.)
AUTO_LOW_BANDWIDTH_S = 3
AUTO_LOW_BANDWIDTH_AFTER_S = 10.0
NOTE_S = 20.0  # how long the status line says the preferences could not be read or saved
LOW_BANDWIDTH_REDRAW_S = 5.0  # how often the screen is redrawn in low-bandwidth mode
# After SIGTERM or a lost terminal, leaving takes a fraction of a second; longer, and it is stuck
# writing to a terminal that takes no more output (which nothing can interrupt): the process ends.
FORCED_END_S = 3.0


class BaseApp(KeysInTurn):
    # Textual reads a relative CSS_PATH beside the module of the class it is used by (FleetApp is in tui/fleet/)
    CSS_PATH = os.path.join(os.path.dirname(__file__), "gpumon.tcss")
    TITLE = "gpumon"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        # Ctrl-C leaves, as in top or nvtop (Textual would only say to press q), from every screen:
        # a dialog (a modal screen) hides the app's other bindings. Selected text takes it first, to copy.
        Binding("ctrl+c", "interrupt", "Quit", show=False, priority=True),
        Binding("question_mark", "help", "Help"),
        Binding("f1", "help", show=False),  # F1 and F10 as in htop, nvtop, btop
        Binding("f10", "quit", show=False),
        Binding("c", "next_theme", "Theme", show=False),
        Binding("exclamation_mark", "alerts", "Alerts", show=False),
        Binding("b", "toggle_low_bandwidth", "Low bandwidth", show=False),
    ]

    def __init__(self, *, readonly: bool = False, theme: str | None = None, rules: list[Rule] | None = None,
                 low_bandwidth: bool = False, holders: HolderTracker | None = None,
                 preferences: PreferenceStore | None = None, theme_given: bool = False,
                 sharing: SharingSettings | None = None) -> None:
        """`holders`: the app's HolderTracker, which `idle` rules then read too (one tracker per app);
        `preferences`: the user's saved choices (None: none, and none kept); `theme_given`: `theme`
        came from the command line, and wins over the saved one; `sharing`: this machine's shared
        place for claims, the queue and reservations ([claims]; None: the defaults)."""
        # The output layer: only changed cells are sent, never faster than the terminal draws them.
        # Textual's own driver, and way of drawing, where this Textual is not the one they were written for.
        super().__init__(driver_class=WireDriver if usable("output layer") else None)
        self._cells = usable("compositor updates as cells", self, "_batch_count", "_running", "_closed", "_driver",
                             "console._color_system")
        self.sharing = sharing or SharingSettings()
        self.sharing_now = SharingNow(self.sharing)  # read in a thread: other users fill the place
        self.launch_cwd = os.getcwd()  # where `r` runs commands unless the user says otherwise
        self.readonly = readonly
        self.requested_theme = theme
        self.theme_given = theme_given
        self.preferences = preferences or PreferenceStore()
        self._note = ""  # said in the status line for a while (preferences not read or not saved)
        self._note_until = 0.0
        self.theme_problems: list[str] = []
        self.theme_names: list[str] = []
        self.engine = AlertEngine(rules or [], tracker=holders, without_claim=self._without_claim)
        self.alert_log: list[AlertEvent] = []
        self.recent_xids = RecentXids()  # heard by a source that listens for them (this machine's)
        self.failure: GpumonError | None = None  # why the data source (or a rule's card) could not be used
        self.crash: Exception | None = None  # a bug that ended the app (main() reports it in one line)
        # The first frame (cli/splash.py) already put the terminal on its alternate screen.
        self.on_alternate_screen = False
        self.low_bandwidth = low_bandwidth  # redraw every LOW_BANDWIDTH_REDRAW_S, not every reading
        self._redrawn_at = float("-inf")
        self.link_behind = 0  # seconds the terminal is behind (from the output layer)
        self._slow_since: float | None = None  # since when it has been AUTO_LOW_BANDWIDTH_S behind
        self._settled = False
        self._forced_end: threading.Timer | None = None

    def _without_claim(self, snapshot: Snapshot):
        """For `unclaimed` rules: this machine's processes on cards others hold (as last read)."""
        return self.sharing_now.without_claim(snapshot)

    def refresh_sharing(self, snapshot: Snapshot | None = None) -> None:
        """Read this machine's shared place again when due, in a thread (sharing/view.SharingNow):
        the views show what the last read found; a folder another user filled holds no frame up."""
        self.sharing_now.refresh(snapshot)

    # -- what a subclass gives --

    def first_screen(self) -> Screen:
        raise NotImplementedError

    def start_source(self) -> None:
        """Start reading (a worker on the app's loop)."""
        raise NotImplementedError

    def refresh_view(self) -> None:
        """Show the latest reading again (the status line changed: low bandwidth, a slow link)."""

    backend_args: dict | None = None  # how launched jobs' supervisors reach this machine's cards
    replay = None  # the recording played back, if any

    @property
    def can_launch(self) -> bool:
        return False

    def settled(self) -> None:
        """The first data is on the screen. What the start built (modules, widgets, styles: some
        75,000 objects) lives as long as the app, so the garbage collector stops walking it: each
        full collection walked it all (~25 ms here, about one every 30 s: 7 % of the TUI's CPU)."""
        if not self._settled:
            self._settled = True
            gc.collect()  # what is already garbage would otherwise be kept for good
            gc.freeze()

    def on_mount(self) -> None:
        self._quit_on_sigterm()
        self.preferences.on_problem = lambda problem: self.call_later(self.preferences_problem, problem)
        if self.preferences.problem:
            self.preferences_problem(self.preferences.problem)
        self._install_themes()
        self.push_screen(self.first_screen())
        self.start_source()

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

    def _quit_on_sigterm(self) -> None:
        """SIGTERM (kill, a logout, a service manager) leaves as `q` does: the terminal restored."""
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._leave_for_good, EXIT_TERMINATED)
        except (NotImplementedError, RuntimeError, ValueError):  # no signals here (not the main thread)
            pass

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
        saved = self.preferences.saved.theme
        if not self.theme_given and saved in self.available_themes:  # a theme file since removed: not that one
            return saved
        if self.requested_theme is None:
            return DEFAULT
        if self.requested_theme not in self.available_themes:
            # Checked again here for themes from the user's directory; the CLI checks first.
            self.notify(f"unknown theme {self.requested_theme!r}; using {DEFAULT}", severity="warning")
            return DEFAULT
        return self.requested_theme

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
                # NO_COLOR / --no-color: None, and the output layer sends attributes (bold, reverse) only.
                colours = None if self.no_color else self.console._color_system or ColorSystem.TRUECOLOR
                driver.draw(renderable, cursor, colours)
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

    def on_terminal_gone(self, message: TerminalGone) -> None:
        """Nobody can see or type into it any more: leave as SIGHUP would have, sources stopped."""
        self._leave_for_good(EXIT_HANGUP)

    def _leave_for_good(self, status: int) -> None:
        """Quit as `q` does; a process whose way out is stuck on its terminal ends after FORCED_END_S
        anyway (its locks die with it; the terminal cannot be restored)."""
        if self._forced_end is None:
            self._forced_end = threading.Timer(FORCED_END_S, os._exit, (status,))
            self._forced_end.daemon = True
            self._forced_end.start()
        self.call_later(self.run_action, f"quit({status})")

    def run(self, *args, **kwargs):
        try:
            return super().run(*args, **kwargs)
        finally:
            if self._forced_end is not None:  # the app has ended: what the caller does next is not stuck
                self._forced_end.cancel()

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
        self.refresh_view()

    def status_note(self) -> str:
        """What the status line says beyond the reading: a slow link."""
        notes = []
        if self._note and time.monotonic() < self._note_until:
            notes.append(self._note)
        if self.low_bandwidth:
            notes.append(f"low bandwidth: every {LOW_BANDWIDTH_REDRAW_S:g} s (b)")
        if self.link_behind >= 1:
            notes.append(f"link {self.link_behind} s behind")
        return "  ".join(notes)

    def action_alerts(self) -> None:
        from gpumon.tui.screens.alerts import AlertsScreen  # on first use: a start does not load it

        if not isinstance(self.screen, AlertsScreen):
            self.push_screen(AlertsScreen(self.engine, self.alert_log))

    def action_help(self) -> None:
        from gpumon.tui.screens.help import HelpScreen  # on first use: a start does not load it

        if not isinstance(self.screen, HelpScreen):
            if not self.is_screen_installed("help"):  # built once: opening it again costs no compose
                self.install_screen(HelpScreen(self.readonly), "help")
            self.push_screen("help")

    def action_next_theme(self) -> None:
        names = self.theme_names or [DEFAULT]
        current = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(current + 1) % len(names)]
        self.notify(f"theme: {self.theme}", timeout=2)
        self.preferences.change(theme=self.theme)

    def preferences_problem(self, problem: str) -> None:
        """The saved choices could not be read or written: said in the status line for a while."""
        self._note, self._note_until = problem, time.monotonic() + NOTE_S
        self._refresh_status()

    async def action_quit(self, status: int = EXIT_OK) -> None:
        self.exit(status)

    async def action_interrupt(self) -> None:
        """Ctrl-C: quit with the status of an interrupted command, unless there is text selected to copy."""
        if self._selected_text():
            raise SkipAction()  # the focused field's or the screen's own Ctrl-C copies it
        await self.action_quit(EXIT_INTERRUPTED)

    def _selected_text(self) -> str:
        focused = self.focused
        selected = getattr(focused, "selected_text", "") if focused is not None else ""
        if isinstance(selected, str) and selected:
            return selected
        try:
            return self.screen.get_selected_text() or ""
        except ScreenStackError:  # no screen (starting, ending): nothing is selected
            return ""


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
