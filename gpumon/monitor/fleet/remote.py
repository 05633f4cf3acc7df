"""gpumon's own subcommands on a fleet host: launch, list and stop jobs, follow a log, signal a
process, read the topology. Each is the host's `gpumon …` run over the shared ssh connection, so
the host applies its own rules (pinning, memory limits, own-processes-only, start-time checks);
for `local` it is this machine's gpumon. Calls block: the TUI makes them from a worker thread.
Anything that fails raises HostError: "HOST: what went wrong", in words. Their ssh processes are tied
to gpumon's life and their output is read with a cap (children.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from gpumon.errors import UsageError
from gpumon.model import Topology
from gpumon.monitor.fleet.children import OutputTooLarge, popen, run_capped
from gpumon.monitor.fleet.hosts import HostSpec
from gpumon.monitor.fleet.schema import SchemaError, jobs_from_remote, topology_from_remote
from gpumon.monitor.fleet.ssh import SshTransport, describe_failure
from gpumon.sanitize import printable

MAX_OUTPUT = 16 << 20


def _lines(text: str) -> str:
    """Output of a host's gpumon, for people: each line made printable, the lines kept."""
    return "\n".join(printable(line) for line in text.strip().splitlines())


class HostError(UsageError):
    """An action on a host failed: the message names the host and says why."""


class RemoteGpumon:
    def __init__(self, spec: HostSpec, transport: SshTransport | None, local_args: Sequence[str] = ()) -> None:
        if transport is None and not spec.is_local:
            raise UsageError(f"{spec.name}: no ssh transport")
        self.spec = spec
        self.transport = transport
        self.local_args = list(local_args)  # `local`: how this gpumon reads the cards (--demo, --nvml-lib)

    @property
    def host(self) -> str:
        return self.spec.name

    def argv(self, args: Sequence[str], tty: bool = False) -> list[str]:
        """The command line that runs `gpumon ARGS` there."""
        if self.spec.is_local:
            return [sys.executable, "-m", "gpumon", *self.local_args, *args]
        return self.transport.gpumon_argv(self.spec, list(args), tty=tty)  # type: ignore[union-attr]

    def _fail(self, returncode: int | None, stderr: bytes) -> HostError:
        text = stderr.decode(errors="replace")
        # The remote gpumon's own error line says it best: drop its "gpumon: error: " prefix.
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if returncode not in (None, 127, 255) and lines and lines[-1].startswith("gpumon: "):
            reason = printable(lines[-1].removeprefix("gpumon: ").removeprefix("error: "))[:300]
        else:
            reason = describe_failure(returncode, text)
        return HostError(f"{self.host}: {reason}")

    def call(self, args: Sequence[str], timeout: float = 60.0) -> str:
        """`gpumon ARGS` there; its stdout, or HostError (also when it sends over MAX_OUTPUT: it is
        read with that cap and stopped at it)."""
        try:
            done = run_capped(self.argv(args), timeout, MAX_OUTPUT)
        except TimeoutError:
            raise HostError(f"{self.host}: timeout (no answer in {timeout:g} s)") from None
        except OutputTooLarge as exc:
            raise HostError(f"{self.host}: `gpumon {args[0]}` {exc} (stopped there)") from None
        except OSError as exc:
            raise HostError(f"{self.host}: cannot run {self.argv(args)[0]!r}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            raise self._fail(done.returncode, done.stderr)
        return done.stdout.decode(errors="replace")

    def _json(self, args: Sequence[str]) -> Any:
        text = self.call(args)
        try:
            return json.loads(text)
        except ValueError:
            raise HostError(f"{self.host}: `gpumon {' '.join(args)}` did not answer with JSON") from None

    def jobs(self) -> list[dict[str, Any]]:
        """Its jobs (`gpumon jobs --json`), oldest first, each with "host" set to this host."""
        try:
            jobs = jobs_from_remote(self._json(["jobs", "--json"]))
        except SchemaError as exc:
            raise HostError(f"{self.host}: unexpected job list: {exc}") from None
        for job in jobs:
            job["host"] = self.host
        return jobs

    def stop_job(self, job_id: str) -> str:
        return _lines(self.call(["jobs", "--stop", job_id]))

    def signal(self, pid: int, started: float | None, action: str) -> str:
        """terminate / kill / interrupt one of the host's processes, checked there (own processes
        only, the same start time: a recycled pid is never hit)."""
        args = ["signal", str(pid), "--signal", action]
        if started is not None:
            args += ["--started", repr(float(started))]
        return _lines(self.call(args))

    def launch(self, run_args: Sequence[str], timeout: float = 120.0) -> str:
        """`gpumon run RUN_ARGS` there (options, then `--` and the command, word for word);
        returns what it printed (the job id, its cards, the log path)."""
        return _lines(self.call(["run", *run_args], timeout=timeout))

    def follow_log(self, job_id: str) -> subprocess.Popen[bytes]:
        """`gpumon jobs --log ID --follow` there: read its stdout; terminate() it to stop (the remote
        side ends when the connection does). Its output is the job's, untrusted: sanitise it."""
        return popen(self.argv(["jobs", "--log", job_id, "--follow"]), stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)

    def topology(self) -> Topology:
        try:
            return topology_from_remote(self._json(["topo", "--json"]))
        except SchemaError as exc:
            raise HostError(f"{self.host}: unexpected topology: {exc}") from None
