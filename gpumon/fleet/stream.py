"""One host over ssh: a long-lived `gpumon snapshot --json --stream` (or nvidia-smi when gpumon is
not installed there), with reconnects.

States it reports: connecting (first try) -> live (a document arrived) -> stale (none for three
intervals, and at least STALE_MIN_S; the connection is still up) -> unreachable (with the reason; the next try is at
`retry_at`) -> reconnecting -> live … Retries back off from 1 s, doubling to 30 s, and start
again from 1 s once the host has been live. A host that lets ssh in but whose gpumon never sends a
first document (a hung driver) is stale after the same window, counted from the login, and without
a reading (so `unreachable` rules count it as away); one whose login never starts (a hung home
directory) once ssh's connect timeout and that window have passed.

The remote side is untrusted: a line longer than MAX_LINE, a line that is not JSON, or a document
that is not schema 1 ends the connection with the reason as an `error`, and the host is tried
again later. ssh's stderr is read as it comes (bounded) so it can never block the remote side, and
a connection given up on is ended with its pipes (children.AsyncChild.end). What the login prints
before gpumon's mark is skipped (remote/login.py). Documents are parsed in a thread, the newest one
at most once an interval: a host that sends large documents back to back costs one parse an
interval, never a queue, and never the loop's time between documents.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from gpumon.fleet import nvidia_smi
from gpumon.fleet.fleet import Source
from gpumon.fleet.remote_claims import taken_from_remote
from gpumon.fleet.schema import SchemaError, snapshot_from_remote
from gpumon.remote.hosts import HostSpec
from gpumon.remote.login import MAX_BANNER, after_mark, is_mark, marked, new_mark
from gpumon.remote.ssh import NOT_FOUND, REMOTE_GPUMON_HINT, SshTransport, describe_failure

MAX_LINE = 4 << 20  # one snapshot document: 8 cards with thousands of processes fit easily
STALE_INTERVALS = 3
STALE_MIN_S = 2.0  # short intervals: a busy host or link is late now and then without being stale
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
CLOSE_GRACE_S = 2.0
LEAVE_GRACE_S = 0.15  # when the fleet stops: the whole exit stays under a second


@dataclass
class Ending:
    """How one connection ended."""

    state: str  # "unreachable" | "error"
    reason: str
    was_live: bool = False
    missing: bool = False  # the program was not found there (exit 127)
    source: str = "gpumon"


class _Bad(Exception):
    """The host sent something unusable: how the connection ends."""

    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.reason)
        self.ending = ending


@dataclass
class _Reading:
    live: bool = False  # a document of this connection was shown
    problem: Ending | None = None


class _Latest:
    """The newest line not yet parsed (one slot: a newer line replaces it), and whether the
    reading has ended."""

    def __init__(self) -> None:
        self.line: bytes | None = None
        self.ended = False
        self._ready = asyncio.Event()

    def put(self, line: bytes) -> None:
        self.line = line
        self._ready.set()

    def end(self) -> None:
        self.ended = True
        self._ready.set()

    async def take(self) -> bytes | None:
        """The next line to parse; None once the reading has ended and none is left."""
        while self.line is None:
            if self.ended:
                return None
            self._ready.clear()
            await self._ready.wait()
        line, self.line = self.line, None
        return line

    def newest(self, line: bytes) -> bytes:
        """`line`, or the one that came after it while waiting."""
        newer, self.line = self.line, None
        return newer if newer is not None else line


def _cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _document(line: bytes):
    """The host's snapshot, and what it said of who holds its cards."""
    doc = json.loads(line)
    return snapshot_from_remote(doc), *taken_from_remote(doc)


class Backoff:
    def __init__(self) -> None:
        self.delay = BACKOFF_FIRST_S

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, BACKOFF_MAX_S)
        return delay

    def reset(self) -> None:
        self.delay = BACKOFF_FIRST_S


async def _read_all(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Everything up to EOF, but never more than limit + 1 bytes (the caller checks the size)."""
    data = bytearray()
    while len(data) <= limit and (chunk := await stream.read(65536)):
        data += chunk
    return bytes(data)


class SshSource(Source):
    """Reads one host through ssh. `kind` is what it is first tried with."""

    kind = "gpumon"

    def __init__(self, spec: HostSpec, transport: SshTransport, interval: float) -> None:
        self.spec = spec
        self.transport = transport
        self.interval = interval
        self.hosts = (spec.name,)

    async def run(self, fleet) -> None:
        name = self.spec.name
        backoff = Backoff()
        first = True
        while True:
            fleet.report(name, "connecting" if first else "reconnecting",
                         error=None if first else fleet.status(name).error)
            first = False
            ending = await self._stream(fleet)
            if ending.missing:  # no gpumon there: read it with nvidia-smi instead
                ending = await self._poll_nvidia_smi(fleet)
            if ending.was_live:
                backoff.reset()
            delay = backoff.next()
            fleet.report(name, ending.state, error=ending.reason, source=ending.source,
                         retry_at=time.time() + delay)
            await asyncio.sleep(delay)

    async def _stream(self, fleet) -> Ending:
        args = ["snapshot", "--json", "--stream", "--interval", f"{self.interval:g}"]
        mark = new_mark()
        try:
            proc = await self.transport.spawn(self.spec, self.transport.gpumon_command(args, mark), limit=MAX_LINE)
        except OSError as exc:
            return Ending("error", f"cannot run ssh: {exc.strerror or exc}")
        state = _Reading()
        latest = _Latest()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._parse(fleet, latest, state))
                await self._read(fleet, proc, mark, latest, state)
        except* _Bad as bad:
            state.problem = bad.exceptions[0].ending  # type: ignore[attr-defined]
        finally:
            # A host that sent something unusable is stopped at once, and so is every host when
            # gpumon leaves (its `q` is not held up by a host that ignores its stdin: the remote
            # side ends with the channel); otherwise closing stdin ends it.
            leaving = _cancelling()
            code = await proc.end(LEAVE_GRACE_S if leaving else CLOSE_GRACE_S,
                                  polite=state.problem is None and not leaving)
        if state.problem is not None:
            return state.problem
        stderr = proc.stderr_tail
        if code == NOT_FOUND:
            return Ending("error", describe_failure(code, stderr), state.live, missing=True)
        if code == 0:
            return Ending("unreachable", "the stream ended", state.live)
        reason = describe_failure(code, stderr)
        return Ending("unreachable" if code == 255 else "error", reason, state.live)

    async def _read(self, fleet, proc, mark: bytes, latest: _Latest, state: _Reading) -> None:
        """The lines as they come: the login's banner skipped, the newest document kept for _parse
        (one that comes before the last was parsed replaces it: never a queue)."""
        name = self.spec.name
        logged_in = False
        banner = 0
        quiet = max(STALE_INTERVALS * self.interval, STALE_MIN_S)
        try:
            while True:
                # Until the login shell has spoken, ssh's own connect timeout decides; a login that
                # never gets as far as the shell (a hung home directory) is silence after that.
                window = quiet if logged_in else self.transport.connect_timeout + quiet
                try:
                    # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
                    # arrives as it times out, and this loop would outlive Fleet.stop().
                    async with asyncio.timeout(window):
                        line = await proc.stdout.readline()
                except TimeoutError:
                    # A connection that has sent no reading has none to show: stale without one
                    # (not the last connection's), which counts as away for `unreachable`.
                    keep = {} if state.live else {"snapshot": None}
                    fleet.report(name, "stale", source="gpumon", error=f"no data for {window:g} s", **keep)
                    continue
                except ValueError:
                    raise _Bad(Ending("error", f"sent a line over {MAX_LINE >> 20} MiB", state.live)) from None
                if not line:
                    return
                if not logged_in:
                    logged_in = is_mark(line, mark)
                    banner += len(line)
                    if banner > MAX_BANNER:
                        raise _Bad(Ending("error", f"its login printed over {MAX_BANNER >> 10} KiB before "
                                                   "gpumon started (see ~/.bashrc and the like there)"))
                    continue
                latest.put(line)
        finally:
            latest.end()

    async def _parse(self, fleet, latest: _Latest, state: _Reading) -> None:
        """At most one document parsed per interval, in a thread: a host that sends large documents
        back to back costs one parse an interval, and never holds up the loop for long."""
        loop = asyncio.get_running_loop()
        next_at = 0.0
        while (line := await latest.take()) is not None:
            if (wait := next_at - loop.time()) > 0:
                await asyncio.sleep(wait)
                line = latest.newest(line)
            next_at = loop.time() + self.interval
            try:
                snapshot, taken, mine = await asyncio.to_thread(_document, line)
            except (ValueError, RecursionError) as exc:  # JSONDecodeError and SchemaError are ValueErrors
                what = str(exc) if isinstance(exc, SchemaError) else "a line that is not JSON"
                raise _Bad(Ending("error", f"sent a bad document: {what}", state.live)) from None
            state.live = True
            fleet.report(self.spec.name, "live", snapshot=snapshot, source="gpumon", note=None, taken=taken, mine=mine)

    async def _poll_nvidia_smi(self, fleet) -> Ending:
        """Agentless: both nvidia-smi queries every interval, over the shared connection."""
        name = self.spec.name
        live = False
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            mark = new_mark()
            try:
                proc = await self.transport.spawn(self.spec, marked(nvidia_smi.remote_command(), mark), limit=MAX_LINE)
            except OSError as exc:
                return Ending("error", f"cannot run ssh: {exc.strerror or exc}", live, source="nvidia-smi")
            proc.stdin.close()
            out = None
            try:
                async with asyncio.timeout(max(10.0, 3 * self.interval)):
                    out = await _read_all(proc.stdout, MAX_LINE)
            except TimeoutError:
                pass
            finally:
                leaving = _cancelling()
                code = await proc.end(LEAVE_GRACE_S if leaving else CLOSE_GRACE_S,
                                      polite=out is not None and len(out) <= MAX_LINE and not leaving)
            if out is None:
                return Ending("unreachable", "timeout (nvidia-smi did not answer)", live, source="nvidia-smi")
            if len(out) > MAX_LINE:
                return Ending("error", f"nvidia-smi sent over {MAX_LINE >> 20} MiB", live, source="nvidia-smi")
            if code == NOT_FOUND:
                return Ending("error", f"neither gpumon nor nvidia-smi is installed there (a gpumon not on the "
                                       f"PATH, as in a venv: {REMOTE_GPUMON_HINT})", live, source="nvidia-smi")
            if code != 0:
                reason = "nvidia-smi: " + describe_failure(code, proc.stderr_tail)
                return Ending("unreachable" if code == 255 else "error", reason, live, source="nvidia-smi")
            out = after_mark(out, mark)
            if out is None:
                return Ending("error", "nvidia-smi: the login did not run it (no mark)", live, source="nvidia-smi")
            try:
                snapshot = nvidia_smi.parse(out.decode(errors="replace"), name)
            except SchemaError as exc:
                return Ending("error", f"nvidia-smi sent something unexpected: {exc}", live, source="nvidia-smi")
            live = True
            fleet.report(name, "live", snapshot=snapshot, source="nvidia-smi", note=nvidia_smi.NOTE)
            await asyncio.sleep(max(0.0, started + self.interval - loop.time()))
