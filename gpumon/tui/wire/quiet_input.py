"""An input thread that sleeps until there is something to do.

Textual's Linux driver reads the terminal on a thread that wakes ten times a second, to see whether
it has been asked to stop and whether a lone ESC has waited long enough to be the Escape key. Over a
day of watching, those wake-ups are a fifth of what an idle gpumon costs (0.06 CPU-s a minute on the
2-core VM, against ~0.3 for a whole monitor's sampling). Here the thread waits for a byte, for the
moment the key parser's own timeout falls due (it says when: none while nothing is half read), or
for the driver to stop, which writes to a pipe the thread also waits on.

A terminal that reads as ended is gone (its window closed, its ssh or tmux session killed): in raw
mode a terminal has no end-of-file key. Closing it sends no SIGHUP to a program in a session of its
own (`su -l USER -c gpumon`), and a program left drawing to it would run for good: the app hears of
it (`TerminalGone`) and ends.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
from codecs import getincrementaldecoder

from textual.drivers.linux_driver import LinuxDriver
from textual.message import Message

from gpumon.tui.wire.guards import usable

try:
    from textual._parser import ParseError
    from textual._time import get_time
    from textual._xterm_parser import XTermParser
except ImportError:  # a Textual without them: guards.py says so, and Textual's own thread runs
    pass

log = logging.getLogger(__name__)


class TerminalGone(Message):
    """The terminal the app reads and draws on has gone away."""


class _WakingEvent(threading.Event):
    """The driver's stop flag; setting it wakes the input thread at once."""

    def __init__(self, wake_fd: int) -> None:
        super().__init__()
        self._wake_fd = wake_fd

    def set(self) -> None:
        super().set()
        if self._wake_fd >= 0:
            try:
                os.write(self._wake_fd, b"x")
            except BlockingIOError:  # the pipe is full: a byte is waiting already
                pass

    def detach(self) -> None:
        self._wake_fd = -1


class QuietInputDriver(LinuxDriver):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._wake: tuple[int, int] | None = None
        if usable("quiet input", self, "exit_event", "fileno", "_debug"):
            self._wake = os.pipe()
            os.set_blocking(self._wake[1], False)
            self.exit_event = _WakingEvent(self._wake[1])

    def run_input_thread(self) -> None:
        if self._wake is None:
            return super().run_input_thread()
        parser = XTermParser(self._debug)
        if not usable("quiet input", parser, "_timeout_time"):
            return super().run_input_thread()
        wake_fd = self._wake[0]
        log.info("input thread %d: waits for the terminal, without a timeout", threading.get_native_id())
        decode = getincrementaldecoder("utf-8")().decode
        selector = selectors.DefaultSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        selector.register(wake_fd, selectors.EVENT_READ)
        reading = True
        terminal = os.isatty(self.fileno)  # asked now: a terminal that has gone away is none any more
        try:
            while not self.exit_event.is_set():
                due = parser._timeout_time
                for key, _ in selector.select(None if due is None else max(0.0, due - get_time())):
                    if key.fd == wake_fd:
                        os.read(wake_fd, 64)
                    elif reading:
                        data = os.read(self.fileno, 4096)
                        if not data:  # end of input: nothing more will come
                            selector.unregister(self.fileno)
                            reading = False
                            if terminal:
                                log.info("the terminal has gone away")
                                self._app.post_message(TerminalGone())
                        for event in parser.feed(decode(data)):
                            self.process_message(event)
                for event in parser.tick():
                    self.process_message(event)
        finally:
            selector.close()
            try:  # the parser's end, as Textual's thread ends it: what is half read is dropped
                for _ in parser.feed(""):
                    pass
            except (EOFError, ParseError):
                pass

    def close(self) -> None:
        super().close()
        if self._wake is not None:
            self.exit_event.detach()  # its number may be another file's once closed
            for fd in self._wake:
                os.close(fd)
            self._wake = None
