"""The processes of a job's container, and the container's end, found through its id.

A container's processes are not the job's children: Podman's are `conmon`'s (itself a child of
init, or of the user's manager), Docker's and nerdctl's are children of containerd's shim. Each
engine's monitor process names the container's full id in its arguments (`conmon -c ID`,
`containerd-shim-runc-v2 … -id ID`), rootful or rootless, with a cgroup or without one (rootless
Podman without systemd makes none): the container's processes are that monitor's descendants.
The id comes from the `--cidfile` gpumon added (jobs/container_command.py). The supervisor follows
them (memory limit, peak, energy), the views mark them as the job's (`container.json`), and a
detached container (`run -d`) keeps its job running until `ENGINE wait ID` says it ended.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from gpumon.jobs.files import read_json, write_atomic
from gpumon.jobs.processes import same_start, since_boot
from gpumon.sanitize import printable

RECORD = "container.json"
_ID = re.compile(r"[0-9a-f]{64}")
_MONITORS = ("conmon", "containerd-shim")  # process names (comm) of the engines' monitors
LOOK_EVERY_S = 1.0  # the supervisor asks every 50 ms whether a detached container still runs
FIND_WITHIN_S = 10.0  # a container not found this long after its id was written is not followed


def _monitor_of(container_id: str) -> psutil.Process | None:
    """The engine's monitor process of the container, by the id in its arguments."""
    for proc in psutil.process_iter(["name"]):
        try:
            if not (proc.info["name"] or "").startswith(_MONITORS):
                continue
            if container_id in proc.cmdline():
                return proc
        except psutil.Error:
            continue
    return None


class ContainerFollow:
    """One attempt's container, from the id its engine writes to `cidfile`."""

    def __init__(self, engine: str, engine_words: list[str], cidfile: Path, detached: bool,
                 env: dict[str, str], directory: Path, tell: Callable[[str], None], remote: bool = False) -> None:
        """`env`: the job's (the engine's `wait` and `stop` must reach the same engine); `tell`:
        says a line to the user (why the container cannot be followed)."""
        self.engine, self.engine_words, self.cidfile, self.detached = engine, engine_words, cidfile, detached
        self.env, self.dir, self.tell = env, directory, tell
        self.id: str | None = None
        self.monitor: psutil.Process | None = None
        self.waiter: subprocess.Popen | None = None
        self.problem: str | None = None  # why it cannot be followed, once known
        self._since = time.monotonic()
        self._looked = 0.0  # when the monitor was last looked for (a pass over every process)
        self.ended = False
        if remote:  # its processes run on the engine's host, not here
            self._problem(f"the {engine} container runs on another host's engine ({' '.join(engine_words[1:])}): "
                          "gpumon cannot see its processes there: its memory limit, peak and energy are not watched")

    def _find(self) -> None:
        if self.id is None:
            try:
                text = self.cidfile.read_text().strip()
            except OSError:
                text = ""
            if not _ID.fullmatch(text):
                return
            self.id, self._since = text, time.monotonic()
        if self.monitor is None and not self.ended and self.problem is None \
                and time.monotonic() - self._looked >= LOOK_EVERY_S:
            self._looked = time.monotonic()
            self.monitor = _monitor_of(self.id)
            if self.monitor is not None:
                write_atomic(self.dir / RECORD, json.dumps({
                    "engine": self.engine, "id": self.id, "monitor_pid": self.monitor.pid,
                    "monitor_booted": since_boot(self.monitor)}))
            elif self.problem is None and time.monotonic() - self._since > FIND_WITHIN_S:
                self._problem(f"the {self.engine} container {self.id[:12]} runs where gpumon cannot see its "
                              "processes (another host's engine?): its memory limit, peak and energy are not watched")
        if self.detached and self.waiter is None and self.id is not None:
            try:  # its end, and its exit status, as its engine says them
                self.waiter = subprocess.Popen([*self.engine_words, "wait", self.id], stdout=subprocess.PIPE,
                                               stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=self.env)
            except OSError as exc:
                self._problem(f"cannot ask {self.engine} when its container ends: {exc.strerror or exc}")

    def _problem(self, line: str) -> None:
        self.problem = line
        self.tell(line)

    def processes(self) -> list[psutil.Process]:
        """The container's processes now (none before it starts or after it ends)."""
        self._find()
        if self.monitor is None:
            return []
        try:
            return self.monitor.children(recursive=True)
        except psutil.Error:
            return []

    def running(self) -> bool:
        """Whether a detached container still runs (an attached one ends with its command); asked
        once the command has ended."""
        if not self.detached or self.ended:
            return False
        self._find()
        # Asked once the command has ended: an engine writes the id before `run -d` returns, so
        # none now means no container was made (a missing image, a bad option).
        if self.waiter is not None:
            if self.waiter.poll() is None:
                return True
        elif self.monitor is not None and _running(self.monitor):
            return True
        self.ended = True
        return False

    def exit_code(self, wait_s: float = 0.0) -> int | None:
        """The detached container's exit status, as `ENGINE wait` printed it (waiting up to
        `wait_s` for it: a container just stopped is still being reaped by its engine)."""
        if self.waiter is None or self.waiter.stdout is None:
            return None
        try:
            self.waiter.wait(wait_s)
        except subprocess.TimeoutExpired:
            return None
        words = self.waiter.stdout.read().split()
        return int(words[-1]) if words and words[-1].lstrip(b"-").isdigit() else None

    def stop(self, grace_s: float) -> str | None:
        """Stop the container through its engine; what went wrong, or None."""
        self._find()
        if self.id is None:
            return None
        try:
            done = subprocess.run([*self.engine_words, "stop", "-t", str(int(grace_s)), self.id],
                                  capture_output=True, text=True, timeout=grace_s + 30, env=self.env)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{self.engine} stop {self.id[:12]}: {exc}"
        if done.returncode != 0:
            return f"{self.engine} stop {self.id[:12]}: " + printable((done.stderr.strip().splitlines() or ["?"])[-1])
        return None

    def close(self) -> None:
        if self.waiter is not None and self.waiter.poll() is None:
            self.waiter.kill()
            self.waiter.wait()


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def recorded_processes(directory: Path) -> list[psutil.Process]:
    """The processes of the job's container as its supervisor recorded it (the views' job marks)."""
    record = read_json(directory / RECORD)
    if not isinstance(record, dict) or not isinstance(record.get("monitor_pid"), int):
        return []
    try:
        monitor = psutil.Process(record["monitor_pid"])
        if not same_start(monitor, None, record.get("monitor_booted")):
            return []
        return monitor.children(recursive=True)
    except psutil.Error:
        return []
