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
a connection given up on is ended with its pipes (children.AsyncChild.end).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from gpumon.fleet import nvidia_smi
from gpumon.fleet.schema import SchemaError, snapshot_from_remote
from gpumon.remote.hosts import HostSpec
from gpumon.remote.ssh import NOT_FOUND, SshTransport, describe_failure

MAX_LINE = 4 << 20  # one snapshot document: 8 cards with thousands of processes fit easily
STALE_INTERVALS = 3
STALE_MIN_S = 2.0  # short intervals: a busy host or link is late now and then without being stale
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
CLOSE_GRACE_S = 2.0
# Before gpumon: an empty line from the remote shell says ssh is in, so a gpumon that then says
# nothing (a hung driver) is told from a connection still being made. `exec`: nothing else stays.
LOGIN_MARK = "echo; exec "


@dataclass
class Ending:
    """How one connection ended."""

    state: str  # "unreachable" | "error"
    reason: str
    was_live: bool = False
    missing: bool = False  # the program was not found there (exit 127)
    source: str = "gpumon"


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


class SshSource:
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
        name = self.spec.name
        args = ["snapshot", "--json", "--stream", "--interval", f"{self.interval:g}"]
        command = LOGIN_MARK + self.transport.gpumon_command(args)
        try:
            proc = await self.transport.spawn(self.spec, command, limit=MAX_LINE)
        except OSError as exc:
            return Ending("error", f"cannot run ssh: {exc.strerror or exc}")
        live = logged_in = False
        problem: Ending | None = None
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
                    keep = {} if live else {"snapshot": None}
                    fleet.report(name, "stale", source="gpumon", error=f"no data for {window:g} s", **keep)
                    continue
                except ValueError:
                    problem = Ending("error", f"sent a line over {MAX_LINE >> 20} MiB", live)
                    break
                if not line:
                    break
                if not logged_in:
                    logged_in = True
                    if line == b"\n":  # the mark
                        continue
                try:
                    snapshot = snapshot_from_remote(json.loads(line))
                except (ValueError, RecursionError) as exc:  # JSONDecodeError and SchemaError are ValueErrors
                    what = str(exc) if isinstance(exc, SchemaError) else "a line that is not JSON"
                    problem = Ending("error", f"sent a bad document: {what}", live)
                    break
                live = True
                fleet.report(name, "live", snapshot=snapshot, source="gpumon", note=None)
        finally:
            # A host that sent something unusable is stopped at once; otherwise closing stdin ends it.
            code = await proc.end(CLOSE_GRACE_S, polite=problem is None)
        if problem is not None:
            return problem
        stderr = proc.stderr_tail
        if code == NOT_FOUND:
            return Ending("error", describe_failure(code, stderr), live, missing=True)
        if code == 0:
            return Ending("unreachable", "the stream ended", live)
        reason = describe_failure(code, stderr)
        return Ending("unreachable" if code == 255 else "error", reason, live)

    async def _poll_nvidia_smi(self, fleet) -> Ending:
        """Agentless: both nvidia-smi queries every interval, over the shared connection."""
        name = self.spec.name
        live = False
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                proc = await self.transport.spawn(self.spec, nvidia_smi.remote_command(), limit=MAX_LINE)
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
                code = await proc.end(CLOSE_GRACE_S, polite=out is not None and len(out) <= MAX_LINE)
            if out is None:
                return Ending("unreachable", "timeout (nvidia-smi did not answer)", live, source="nvidia-smi")
            if len(out) > MAX_LINE:
                return Ending("error", f"nvidia-smi sent over {MAX_LINE >> 20} MiB", live, source="nvidia-smi")
            if code == NOT_FOUND:
                return Ending("error", "neither gpumon nor nvidia-smi is installed there", live, source="nvidia-smi")
            if code != 0:
                reason = "nvidia-smi: " + describe_failure(code, proc.stderr_tail)
                return Ending("unreachable" if code == 255 else "error", reason, live, source="nvidia-smi")
            try:
                snapshot = nvidia_smi.parse(out.decode(errors="replace"), name)
            except SchemaError as exc:
                return Ending("error", f"nvidia-smi sent something unexpected: {exc}", live, source="nvidia-smi")
            live = True
            fleet.report(name, "live", snapshot=snapshot, source="nvidia-smi", note=nvidia_smi.NOTE)
            await asyncio.sleep(max(0.0, started + self.interval - loop.time()))
