"""The Textual app: owns the sampler and the themes, and hands snapshots to the main screen.

`create_app` is the one way to build it: the CLI, the tests and the screenshot script all use it.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping

from textual.app import App
from textual.binding import Binding

from gpumon.alerting.rules import AlertEngine, AlertEvent, Rule
from gpumon.errors import EXIT_OK, UsageError
from gpumon.model import Snapshot
from gpumon.monitor.backends import Backend
from gpumon.monitor.recording import Recorder
from gpumon.monitor.sampler import Sampler
from gpumon.tui.screens.alerts import AlertsScreen
from gpumon.tui.screens.help import HelpScreen
from gpumon.tui.screens.main import MainScreen
from gpumon.tui.themes import DEFAULT, MONOCHROME, load_themes

log = logging.getLogger(__name__)


class GpumonApp(App[int]):
    CSS_PATH = "gpumon.tcss"
    TITLE = "gpumon"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("question_mark", "help", "Help"),
        Binding("c", "next_theme", "Theme", show=False),
        Binding("exclamation_mark", "alerts", "Alerts", show=False),
        Binding("space", "replay_pause", "Pause"),
        Binding("full_stop", "replay_step", "Step"),
        Binding("plus", "replay_speed(2)", "Faster"),
        Binding("minus", "replay_speed(0.5)", "Slower"),
    ]

    def __init__(self, sampler: Sampler, *, readonly: bool = False, theme: str | None = None,
                 env: Mapping[str, str] | None = None, sample_count: int | None = None,
                 rules: list[Rule] | None = None, recorder: Recorder | None = None,
                 backend_args: dict | None = None) -> None:
        super().__init__()
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
        self.main_screen = MainScreen(sampler.history, sampler.interval, sampler.backend.real_pids, readonly, env)

    def on_mount(self) -> None:
        themes, self.theme_problems = load_themes()
        for theme in themes:
            self.register_theme(theme)
        self.theme_names = [t.name for t in themes]
        self.theme = self._initial_theme()
        for problem in self.theme_problems:
            self.notify(problem, severity="warning", timeout=8)
        self.push_screen(self.main_screen)
        self.sampler.subscribe(self._on_snapshot)
        self.run_worker(self.sampler.run(self.sample_count), name="sampler", group="sampler")

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
        if not snapshot.stale:
            if self.recorder is not None and (problem := self.recorder.write(snapshot)):
                self.notify(problem, severity="error", timeout=10)
            events = self.engine.evaluate(snapshot)
            self.alert_log = (self.alert_log + events)[-200:]
            for event in events:
                if event.event == "firing":
                    self.notify(f"GPU {event.gpu}: {event.rule}", title="Alert", severity="error", timeout=6)
            self.main_screen.alerts = self.engine.firing()
        if self.main_screen.is_attached:
            self.main_screen.show_snapshot(snapshot)

    def action_alerts(self) -> None:
        if not isinstance(self.screen, AlertsScreen):
            self.push_screen(AlertsScreen(self.engine, self.alert_log))

    def on_unmount(self) -> None:
        self.sampler.stop()

    @property
    def can_launch(self) -> bool:
        return self.backend_args is not None and self.sampler.backend.name != "replay"

    # -- replay controls (only offered when playing back a recording) --

    @property
    def replay(self):
        backend = self.sampler.backend
        return backend if backend.name == "replay" else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action.startswith("replay_"):
            return self.replay is not None
        return True

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
        if self.sampler.latest is not None and self.main_screen.is_attached:
            self.main_screen.show_snapshot(self.sampler.latest)

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(self.readonly))

    def action_next_theme(self) -> None:
        names = self.theme_names or [DEFAULT]
        current = names.index(self.theme) if self.theme in names else -1
        self.theme = names[(current + 1) % len(names)]
        self.notify(f"theme: {self.theme}", timeout=2)

    async def action_quit(self) -> None:
        self.sampler.stop()
        self.exit(EXIT_OK)


def create_app(backend: Backend, *, interval: float = 1.0, readonly: bool = False, theme: str | None = None,
               env: Mapping[str, str] | None = None, sample_count: int | None = None,
               rules: list[Rule] | None = None, recorder: Recorder | None = None,
               backend_args: dict | None = None) -> GpumonApp:
    return GpumonApp(Sampler(backend, interval=interval), readonly=readonly, theme=theme, env=env,
                     sample_count=sample_count, rules=rules, recorder=recorder, backend_args=backend_args)


def _check_theme(name: str | None) -> None:
    if name is None:
        return
    themes, _ = load_themes()
    names = [t.name for t in themes]
    if name not in names:
        raise UsageError(f"unknown theme {name!r}; choose from {', '.join(names)}")


def run_app(args: argparse.Namespace, backend: Backend, rules: list[Rule] | None = None,
            backend_args: dict | None = None, env: Mapping[str, str] | None = None) -> int:
    """`env`: the environment gpumon was started with (for CUDA ordinals and launched jobs), before
    the changes below."""
    env = dict(os.environ if env is None else env)
    _check_theme(args.theme)
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
    recorder = Recorder(args.record) if args.record else None
    app = create_app(backend, interval=args.interval, readonly=args.readonly, theme=args.theme,
                     rules=rules, recorder=recorder, backend_args=backend_args, env=env)
    try:
        status = app.run()
    finally:
        if recorder is not None:
            recorder.close()
        backend.close()
    return status if isinstance(status, int) else EXIT_OK
