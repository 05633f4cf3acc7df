"""Acting on a host, this machine or a fleet host, through one interface: launch a job, list,
stop and follow jobs, signal a process, read the topology. Every view that acts (the TUI's `r`,
`J`, `x`/`X`, the CLI's `run --host`, `jobs --hosts`) holds a `Host` and does not know which kind.

    host = host_for(fleet, "gpu01")      # or LocalHost(local_args), RemoteHost(spec, transport)
    host.launch(request)                 # blocking: the TUI calls these from a worker thread

Both kinds run the host's own `gpumon` subcommand (`run`, `jobs --json`, `jobs --stop`,
`jobs --log --follow`, `signal`, `topo --json`): over the shared ssh connection for a fleet host,
as a child process for this machine. So the host applies its own rules (pinning, memory limits,
own processes only, start-time checks), and a local and a remote host answer the same question
with the same fields, checked by the same schema, and fail with the same kind of message: a
HostError, "HOST: what went wrong". Its children are tied to gpumon's life and their output is
read with a cap (remote/children.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from gpumon.errors import EXIT_NONE_READ, UsageError
from gpumon.fleet import Fleet
from gpumon.fleet.schema import SchemaError, jobs_from_remote, launched_from_remote, topology_from_remote
from gpumon.jobs.child_gpumon import child_argv
from gpumon.jobs.jobs_reader import JobsReader
from gpumon.jobs.launch import LaunchRequest
from gpumon.jobs.remote_launch import run_args
from gpumon.model import Topology
from gpumon.remote.children import OutputTooLarge, call, popen, run_capped
from gpumon.remote.hosts import LOCAL, HostSpec
from gpumon.remote.login import MAX_BANNER, after_mark, new_mark, reader_after_mark
from gpumon.remote.ssh import SshTransport, describe_failure
from gpumon.sanitize import printable

MAX_OUTPUT = 16 << 20
MAX_PARALLEL = 32  # hosts asked at once for their jobs
TOPOLOGY_PARALLEL = 16  # hosts asked at once for their topology (each runs the driver there)


class HostError(UsageError):
    """An action on a host failed: the message names the host and says why."""


class HostNotRead(HostError):
    """The host's gpumon could not be asked at all (no connection, no answer, not installed): for a
    command, a host not read (exit status 5, as every fleet command says it), not bad input."""

    exit_status = EXIT_NONE_READ


class Host(Protocol):
    name: str

    def launch(self, request: LaunchRequest, timeout: float = 120.0) -> str:
        """Start the job there; what the host printed (the job id, its cards, the log path)."""

    def run_here(self, request: LaunchRequest, tty: bool = True) -> int:
        """The job in this terminal (Foreground), until it ends; its exit status."""

    def jobs(self) -> list[dict[str, Any]]:
        """Its jobs (the fields of `gpumon jobs --json`), oldest first, "host" set to its name."""

    def stop(self, job_id: str) -> str:
        """Stop the job; what the host said."""

    def signal(self, pid: int, started: float | None, action: str) -> str:
        """terminate / kill / interrupt one of its processes: own processes only, and only the
        process that started at `started` (a recycled pid is never hit)."""

    def follow_log(self, job_id: str, follow: bool = True) -> subprocess.Popen[bytes]:
        """The job's log as it grows: read `stdout`, terminate() to stop. Untrusted: sanitise it."""

    def topology(self) -> Topology:
        """How its cards are linked."""


def _lines(text: str) -> str:
    """Output of a host's gpumon, for people: each line made printable, the lines kept."""
    return "\n".join(printable(line) for line in text.strip().splitlines())


SHOWN_ANSWER = 200  # characters of an answer that was not what was asked for


def _what_it_said(text: str) -> str:
    text = text.strip()
    if not text:
        return "it answered nothing"
    more = "…" if len(text) > SHOWN_ANSWER else ""
    return f"it said “{printable(text[:SHOWN_ANSWER])}{more}”"


class GpumonHost:
    """A host reached through its own `gpumon`: a subclass says how to start it (`argv`)."""

    name: str
    env: dict[str, str] | None = None  # the children's environment (None: this process's)
    logs_in = False  # reached through a login that may print before gpumon (its output follows a mark)

    def argv(self, args: Sequence[str], tty: bool = False, mark: bytes | None = None) -> list[str]:
        """The command line that runs `gpumon ARGS` there (printing `mark` first, for a login)."""
        raise NotImplementedError

    def _fail(self, returncode: int | None, stderr: bytes) -> HostError:
        text = stderr.decode(errors="replace")
        # The host's gpumon's own error line says it best: drop its "gpumon: error: " prefix.
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if returncode not in (None, 127, 255) and lines and lines[-1].startswith("gpumon: "):
            reason = printable(lines[-1].removeprefix("gpumon: ").removeprefix("error: "))[:300]
            return HostError(f"{self.name}: {reason}")
        return HostNotRead(f"{self.name}: {describe_failure(returncode, text)}")

    def call(self, args: Sequence[str], timeout: float = 60.0) -> str:
        """`gpumon ARGS` there; its stdout, or HostError (also when it sends over MAX_OUTPUT: it is
        read with that cap and stopped at it)."""
        mark = new_mark() if self.logs_in else None
        try:
            done = run_capped(self.argv(args, mark=mark), timeout, MAX_OUTPUT, env=self.env)
        except TimeoutError:
            raise HostNotRead(f"{self.name}: timeout (no answer in {timeout:g} s)") from None
        except OutputTooLarge as exc:
            raise HostError(f"{self.name}: `gpumon {args[0]}` {exc} (stopped there)") from None
        except OSError as exc:
            raise HostNotRead(f"{self.name}: cannot run {self.argv(args)[0]!r}: {exc.strerror or exc}") from None
        if done.returncode != 0:
            raise self._fail(done.returncode, done.stderr)
        out = done.stdout if mark is None else after_mark(done.stdout, mark)
        if out is None:
            raise HostError(f"{self.name}: its login printed over {MAX_BANNER >> 10} KiB, or ran something "
                            "other than gpumon (see ~/.bashrc and the like there)")
        return out.decode(errors="replace")

    def _json(self, args: Sequence[str]) -> Any:
        text = self.call(args)
        try:
            return json.loads(text)
        except ValueError:
            raise HostError(f"{self.name}: `gpumon {' '.join(args)}` did not answer with JSON") from None

    def launch(self, request: LaunchRequest, timeout: float = 120.0) -> str:
        """Launched only when its gpumon answers with the job it made; any other answer (none, a
        login banner, junk) is a HostError that says what it was."""
        answer = self.call(["run", "--json", *run_args(request)], timeout=timeout)
        try:
            job, said = launched_from_remote(json.loads(answer))
        except (ValueError, SchemaError) as exc:
            detail = f" ({exc})" if isinstance(exc, SchemaError) else ""
            raise HostError(f"{self.name}: `gpumon run` did not answer with the job it started{detail}: "
                            f"{_what_it_said(answer)}") from None
        return "\n".join(said) or f"job {job['id']} ({job['name']}) {job['state']}"

    def run_here(self, request: LaunchRequest, tty: bool = True) -> int:
        """With a terminal there, Ctrl-C is the job's (it reaches it through that terminal), not
        this gpumon's; without one, Ctrl-C ends the connection and this gpumon as before."""
        argv = self.argv(["run", *run_args(request)], tty=tty)
        if not tty:
            return call(argv, env=self.env)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return call(argv, env=self.env)
        finally:
            signal.signal(signal.SIGINT, previous)

    def jobs(self) -> list[dict[str, Any]]:
        return self._listed(self._json(["jobs", "--json"]))

    def _listed(self, doc: Any) -> list[dict[str, Any]]:
        """`gpumon jobs --json`'s list, checked, each job named by this host."""
        try:
            jobs = jobs_from_remote(doc)
        except SchemaError as exc:
            raise HostError(f"{self.name}: unexpected job list: {exc}") from None
        for job in jobs:
            job["host"] = self.name
        return jobs

    def stop(self, job_id: str) -> str:
        return _lines(self.call(["jobs", "--stop", job_id]))

    def signal(self, pid: int, started: float | None, action: str) -> str:
        args = ["signal", str(pid), "--signal", action]
        if started is not None:
            args += ["--started", repr(float(started))]
        return _lines(self.call(args))

    def follow_log(self, job_id: str, follow: bool = True) -> subprocess.Popen[bytes]:
        """stdin stays open: its end (this process gone) tells a remote tail to stop too."""
        mark = new_mark() if self.logs_in else None
        proc = popen(self.argv(["jobs", "--log", job_id] + (["--follow"] if follow else []), mark=mark),
                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     start_new_session=True, env=self.env)
        if mark is not None:
            proc.stdout = reader_after_mark(proc.stdout, mark)  # type: ignore[arg-type]
        return proc

    def topology(self) -> Topology:
        try:
            return topology_from_remote(self._json(["topo", "--json"]))
        except SchemaError as exc:
            raise HostError(f"{self.name}: unexpected topology: {exc}") from None


class LocalHost(GpumonHost):
    """This machine, through this gpumon's own subcommands run as children: the same code the
    command line runs, and the same fields and messages as any other host. The single-machine
    TUI and the fleet's `local` both act through it, so the two cannot drift apart."""

    def __init__(self, local_args: Sequence[str] = (), env: Mapping[str, str] | None = None) -> None:
        self.name = LOCAL
        self.local_args = list(local_args)  # how this gpumon reads the cards (--demo, --nvml-lib)
        # The environment gpumon was started with (the TUI changes its own: NO_COLOR, ...): the
        # jobs launched here get it, as they would from a shell.
        self.env = None if env is None else dict(env)
        self._records = JobsReader()  # what changed since the last listing, read again

    def argv(self, args: Sequence[str], tty: bool = False, mark: bytes | None = None) -> list[str]:
        return child_argv("gpumon", [*self.local_args, *args])

    def jobs(self) -> list[dict[str, Any]]:
        """Read here, in this process: what `gpumon jobs --json` prints (`Job.to_dict`), through the
        same check, without a child gpumon each time (the J screen lists them every second).
        Launching, stopping and signalling keep the child: it acts in the environment gpumon was
        started with and applies the command line's own checks."""
        try:
            return self._listed([job.to_dict() for job in self._records.read()])
        except OSError as exc:
            raise HostError(f"{self.name}: cannot read the job records: {exc.strerror or exc}") from None


class RemoteHost(GpumonHost):
    """A fleet host, through its gpumon over the shared ssh connection."""

    logs_in = True

    def __init__(self, spec: HostSpec, transport: SshTransport) -> None:
        self.name = spec.name
        self.spec = spec
        self.transport = transport

    def argv(self, args: Sequence[str], tty: bool = False, mark: bytes | None = None) -> list[str]:
        return self.transport.gpumon_argv(self.spec, list(args), tty=tty, mark=mark)


def local_args(opened: Mapping[str, Any]) -> list[str]:
    """How a gpumon started here reads the same cards as this one, given how this one opened them
    (cli/common.py `backend_args`): --demo and its scenario and seed, --nvml-lib, the fs roots."""
    out = ["--demo", "--scenario", opened["demo"], "--seed", str(opened.get("seed") or 0)] if opened.get("demo") else []
    for flag, key in (("--nvml-lib", "nvml_lib"), ("--path.sysfs", "sysfs"), ("--path.procfs", "procfs")):
        if opened.get(key):
            out += [flag, str(opened[key])]
    return out


def host_at(spec: HostSpec, transport: SshTransport | None, local_args: Sequence[str] = ()) -> GpumonHost:
    """The host a HostSpec names: this machine for `local`, else over `transport`."""
    if spec.is_local:
        return LocalHost(local_args)
    if transport is None:
        raise UsageError(f"{spec.name}: no ssh transport")
    return RemoteHost(spec, transport)


def host_for(fleet: Fleet, name: str) -> GpumonHost:
    """A host of the fleet to act on. HostError for one only read from afar (Prometheus): nothing
    can reach it."""
    if name not in fleet.specs:
        try:
            refusal = fleet.status(name).launch_refusal
        except KeyError:
            refusal = "not in the fleet"
        raise HostError(f"{name}: {refusal}")
    return host_at(fleet.specs[name], fleet.transport, fleet.local_args)


def jobs_of(hosts: Sequence[Host]) -> tuple[list[dict[str, Any]], list[HostError]]:
    """Every job of these hosts, asked of them all at once (host by host, each oldest first), and
    the error of each host that could not say."""
    def listed(host: Host) -> list[dict[str, Any]] | HostError:
        try:
            return host.jobs()
        except HostError as exc:
            return exc

    if not hosts:
        return [], []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(hosts))) as pool:
        results = list(pool.map(listed, hosts))
    rows = [job for result in results if not isinstance(result, HostError) for job in result]
    return rows, [result for result in results if isinstance(result, HostError)]


def topologies_of(hosts: Sequence[Host]) -> tuple[dict[str, Topology], list[HostError]]:
    """The link topology of each host, asked of them all at once: the answer takes as long as the
    slowest host, not the sum of them."""
    def ask(host: Host) -> Topology | HostError:
        try:
            return host.topology()
        except HostError as exc:
            return exc

    if not hosts:
        return {}, []
    with ThreadPoolExecutor(max_workers=min(TOPOLOGY_PARALLEL, len(hosts))) as pool:
        answers = dict(zip([h.name for h in hosts], pool.map(ask, hosts)))
    return ({name: a for name, a in answers.items() if not isinstance(a, HostError)},
            [a for a in answers.values() if isinstance(a, HostError)])
