"""The selected job's log as it grows, for `J`: read in a thread of its own, each piece made
printable there (it is the job's output: colour codes, cursor moves) and handed to the screen on
the app's loop.

A job of this machine's own J is tailed from its file; a job of another host is followed through
that host's gpumon (`gpumon jobs --log ID --follow`, Host.follow_log).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual.app import App

from gpumon.errors import GpumonError
from gpumon.sanitize import printable
from gpumon.tui.literal_text import plain_lines

if TYPE_CHECKING:
    from gpumon.jobs.host import Host

log = logging.getLogger(__name__)
LOG_TAIL_BYTES = 64 * 1024  # of a file's end, shown when it is first opened
TAIL_S = 1.0  # how often a file is looked at for more
LONG_LINE = 4096  # bytes of one log line held before they are shown as a line of their own

Show = Callable[[str], Any]


def _deliver(app: App, show: Show, text: str) -> None:
    """On the app's loop, waiting for it: a log that comes faster than it is shown is read no
    faster (a job writing without end fills neither gpumon's memory nor the app's queue)."""
    try:
        app.call_from_thread(show, text)
    except RuntimeError:  # the app has ended
        log.debug("log text dropped: the app has ended")


class LogTail:
    """Reads what was appended to a file since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def read_new(self) -> str:
        try:
            size = self.path.stat().st_size
            with open(self.path, "rb") as f:
                if self.offset == 0 and size > LOG_TAIL_BYTES:
                    self.offset = size - LOG_TAIL_BYTES
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return ""
        self.offset += len(data)
        return data.decode(errors="replace")


class FileLog:
    """A log file here, looked at every TAIL_S until stopped."""

    def __init__(self, path: str | None) -> None:
        self.tail = LogTail(Path(path or ""))
        self._stopped = threading.Event()

    def start(self, app: App, show: Show) -> None:
        def tail() -> None:
            while not self._stopped.is_set():
                if new := self.tail.read_new():
                    # Made visible: a training log's colour codes never reach the terminal (Log passes ESC through).
                    _deliver(app, show, plain_lines(new))
                self._stopped.wait(TAIL_S)

        threading.Thread(target=tail, name="gpumon-log", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()


class HostLog:
    """A job's log as its host's gpumon sends it, until stopped (its reader killed)."""

    def __init__(self, host: Host, job_id: str) -> None:
        self.host = host
        self.job_id = job_id
        self._follower: subprocess.Popen[bytes] | None = None

    def start(self, app: App, show: Show) -> None:
        name = self.host.name
        try:
            follower = self._follower = self.host.follow_log(self.job_id)
        except (OSError, GpumonError) as exc:
            show(f"[{name}: cannot follow the log: {printable(str(getattr(exc, 'strerror', None) or exc))}]\n")
            return

        def pump() -> None:
            """The job's output is untrusted: each line made printable before it is shown."""
            pending = b""
            while chunk := follower.stdout.read1(65536):  # type: ignore[union-attr]
                pending += chunk
                lines = pending.split(b"\n")
                pending = lines.pop()
                if len(pending) >= LONG_LINE:  # a line with no end in sight: shown in pieces, not gathered
                    lines.append(pending)
                    pending = b""
                if lines:
                    _deliver(app, show, "".join(plain_lines(line.decode(errors="replace")) + "\n" for line in lines))
            if pending:
                _deliver(app, show, plain_lines(pending.decode(errors="replace")) + "\n")
            code = follower.wait()
            if code not in (0, -9, -15):  # ours to end: killed when another job is selected
                why = printable(follower.stderr.read(4096).decode(errors="replace").strip())  # type: ignore[union-attr]
                _deliver(app, show, f"[{name}: the log could not be followed ({why or f'status {code}'})]\n")

        threading.Thread(target=pump, name="gpumon-log", daemon=True).start()

    def stop(self) -> None:
        follower, self._follower = self._follower, None
        if follower is not None and follower.poll() is None:
            follower.kill()  # the remote tail ends with its connection
