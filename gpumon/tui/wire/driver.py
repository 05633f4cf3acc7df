"""Textual's Linux driver with gpumon's output layer: only changed cells go out (`ScreenDiff`),
and never faster than the terminal draws them (`Pacer`).

Textual writes each frame and then flushes; here the frame is read into the wanted screen, and a
flush sends the difference unless the previous frame has not reached the terminal yet. The
terminal's answer to the question that ends each frame arrives on the input thread, which then
sends whatever changed meanwhile. The app hears how far behind the link is (`LinkLag`). Its input thread sleeps
until a key comes (quiet_input.py).

Where this Textual is not the one it was written for (guards.py), the app takes Textual's own
driver; a WireDriver whose instance lacks what it uses (`wired` False) passes everything through.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from textual import events
from textual.geometry import Offset
from textual.message import Message

from gpumon.tui.wire import updates
from gpumon.tui.wire.guards import usable
from gpumon.tui.wire.pacing import Pacer
from gpumon.tui.wire.quiet_input import QuietInputDriver
from gpumon.tui.wire.screen import ScreenDiff

if TYPE_CHECKING:
    from textual._compositor import CompositorUpdate

ALTERNATE_SCREEN = "\x1b[?1049h"
REPORT_STEP_S = 1.0  # the app hears of the lag in whole seconds: no message for every frame


class LinkLag(Message):
    """How many seconds behind the terminal is (0: keeping up)."""

    def __init__(self, seconds: int) -> None:
        super().__init__()
        self.seconds = seconds


class WireDriver(QuietInputDriver):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._diff = ScreenDiff(*self._get_terminal_size())
        self._pacer = Pacer()
        self._lock = threading.Lock()  # the input thread sends too, when an answer arrives
        self._new_size: tuple[int, int] | None = None
        self._closing = False
        self._reported = 0
        self.wired = usable("output layer", self, "_writer_thread", "_app")
        self._skip_alternate = False

    # -- Textual's side --

    def _get_terminal_size(self) -> tuple[int, int]:
        size = super()._get_terminal_size()
        self._new_size = size  # may run in a signal handler: only a note, taken up by write()
        return size

    def start_application_mode(self) -> None:
        self._closing = False
        # Already there (the first frame, cli/splash.py): entering again would save the alternate
        # screen's cursor, which leaving then restores, and the shell's prompt would come back over
        # its earlier output. Only at the start: after a suspend the terminal is on its normal screen.
        self._skip_alternate = getattr(self._app, "on_alternate_screen", False)
        self._app.on_alternate_screen = False
        with self._lock:
            self._new_size = None
            self._diff.resize(*self._get_terminal_size())
        super().start_application_mode()

    def stop_application_mode(self) -> None:
        self._closing = True  # the last frame and the terminal's restoration go out at once
        self.flush()
        super().stop_application_mode()

    def write(self, data: str) -> None:
        if self._skip_alternate and ALTERNATE_SCREEN in data:
            self._skip_alternate = False
            data = data.replace(ALTERNATE_SCREEN, "", 1)
        if not self.wired:
            return super().write(data)
        with self._lock:
            self._take_new_size()
            self._diff.feed(data)

    def draw(self, update: CompositorUpdate, cursor: Offset, color_system) -> None:
        """A compositor update as cells (see updates.py), then the cursor where Textual puts it:
        what `write` would make of Textual's string for it, without the string."""
        with self._lock:
            self._take_new_size()
            updates.draw(self._diff, update, color_system)
            self._diff.place_cursor(cursor.y, cursor.x)

    def _take_new_size(self) -> None:
        if self._new_size is not None:
            self._diff.resize(*self._new_size)
            self._new_size = None

    def flush(self) -> None:
        if not self.wired:
            return super().flush()
        self._send()

    def process_message(self, message: Message) -> None:
        if not self.wired:
            pass
        elif isinstance(message, events.CursorPosition):
            if self._pacer.answered(time.monotonic()):
                self._send()
                return
        elif isinstance(message, events.Resize):  # in-band resize reports
            self._new_size = (message.size.width, message.size.height)
        super().process_message(message)

    # -- sending --

    def _send(self) -> None:
        now = time.monotonic()
        with self._lock:
            if self._writer_thread is None:
                return
            draw = self._closing or (self._diff.pending and self._pacer.may_draw(now))
            out = self._diff.render(draw=draw)
            if draw and out and not self._closing:
                out += self._pacer.probe(now)
            if out:
                super().write(out)
            behind = int(self._pacer.behind(now) // REPORT_STEP_S)
        if behind != self._reported:
            self._reported = behind
            self._app.post_message(LinkLag(behind))
