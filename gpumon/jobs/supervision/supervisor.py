"""The supervisor of one job: `python -m gpumon.jobs.supervision.supervisor JOB_DIR [--foreground]`.

It waits for a free card when the job is queued, pins and starts the command, watches its GPU
memory per card (the limit's guarantee), and records how it ended: `exited`, `killed` (by gpumon,
or by a signal, which is named), `failed` (could not start, with the reason) or `cancelled`
(stopped while queued). SIGTERM asks it to stop the job: SIGTERM to the command's process group,
SIGKILL after a grace period. SIGINT (Ctrl-C) is forwarded to a detached command (a foreground one
gets it from the terminal itself); the supervisor waits for the command and records the end either
way. The command is reaped only after the last signal: a reaped pid may already be someone else's
(jobs/supervision/process_tree.py). It is single-threaded, so it can set its own CPU affinity
before starting the command, which inherits it (no preexec_fn).

It also watches the job's cards (jobs/supervision/failover.py: lost, a fatal XID, a failed fabric). A job run
with `--failover N` whose card fails is stopped and started again, up to N times, on other cards
chosen as `select` chooses (never a card that failed), waiting like `--wait` until they are free;
each attempt is recorded (jobs/attempts.py), marked in the log, and each move is added to the
host's job event log for `watch` (jobs/supervision/job_events.py). Other jobs are left to run as before; their
record says that the card failed.

No I/O error ends its watch: records are written best effort, kept and written again
(jobs/supervision/best_effort_writes.py). A command whose records cannot be written is not started (nobody could
find it); a limit it cannot watch (BLIND_S) stops the job rather than leave it unwatched.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from gpumon.cards.backends import Backend, open_backend
from gpumon.errors import GpumonError
from gpumon.failover_event import FailoverEvent
from gpumon.jobs.attempts import RECORD as ATTEMPTS_RECORD
from gpumon.jobs.attempts import Attempt, attempts_json, banner
from gpumon.jobs.claims_and_queue import SupervisorSharing
from gpumon.jobs.container_command import asked_cards, check_cards, locate
from gpumon.jobs.container_pin import additions, usable_nodes
from gpumon.jobs.container_processes import ContainerFollow
from gpumon.jobs.files import WAITING_RECORD, take_environment
from gpumon.jobs.limits import by_index, card_limits, job_memory, limit_environment, limits_for, over_limit, unwatched
from gpumon.jobs.placement import pin, resolve_spec
from gpumon.jobs.processes import since_boot
from gpumon.jobs.records import THIS_HOST, JobSpec
from gpumon.jobs.supervision import job_events
from gpumon.jobs.supervision.attempt_end import AttemptEnd
from gpumon.jobs.supervision.best_effort_writes import BestEffortWrites, mark_log, say
from gpumon.jobs.supervision.energy import JobEnergy
from gpumon.jobs.supervision.failover import (
    Trouble,
    XidsSeen,
    card_trouble,
    job_config,
    job_health,
    xid_trouble,
)
from gpumon.jobs.supervision.process_tree import CommandTree
from gpumon.jobs.supervision.wait_for_free_cards import FreeCardsWait
from gpumon.model import Snapshot
from gpumon.sanitize import printable
from gpumon.sharing.folder import sharing_settings
from gpumon.units import format_duration

GRACE_S = 5.0
STUCK_S = 30.0  # a process that outlives SIGKILL this long is stuck in the driver: it never runs again
SETTLE_S = 1.0  # after an error exit: how long a failing card has to say so (an XID comes a moment late)
POLL_S = 0.05
STOPPED = "stopped by the user"
# How long the watchdog may go without reading the job's memory (the driver fails, a sample raises)
# before it stops a job with a limit: a limit that is not watched is no limit.
BLIND_S = 10.0
FLUSH_S = 600.0  # how long a supervisor whose records cannot be written tries before it leaves


class Supervisor:
    def __init__(self, directory: Path, foreground: bool) -> None:
        self.dir = directory
        self.foreground = foreground
        self.spec = JobSpec.from_dict(json.loads((directory / "job.json").read_text()))
        self.stop_requested: str | None = None
        self.interrupted = False  # Ctrl-C came
        self.child: subprocess.Popen | None = None
        self.tree: CommandTree | None = None  # the command and what it started: see jobs/supervision/process_tree.py
        self.container: ContainerFollow | None = None  # the container the command started, if it starts one
        self.peak = 0
        self.attempts: list[Attempt] = []
        self.failed_cards: set[str] = set()  # UUIDs of cards that failed while we watched: never chosen again
        self.latest: Snapshot | None = None
        self.xids_seen = XidsSeen()  # per card, for the XID policy's thresholds
        # Every record is written best effort (jobs/supervision/best_effort_writes.py): no write ends the watch.
        self.records = BestEffortWrites(directory)
        self.energy = JobEnergy(directory, self.records.write)  # what its cards used (jobs/supervision/energy.py)
        self.limits: dict[int, int] = {}  # the memory limit on each of the attempt's cards, by index
        self.all_cpus = os.sched_getaffinity(0)

    # -- records --

    def _write(self, name: str, data: dict, indent: int | None = None) -> None:
        self.records.write(name, json.dumps(data, indent=indent))

    def _finish(self, state: str, reason: str | None, exit_code: int | None = None, sig: int | None = None) -> None:
        self._write("exit.json", {"state": state, "exit_code": exit_code, "signal": sig, "ended": time.time(),
                                  "reason": reason})

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stop_requested = STOPPED

    def _on_sigint(self, signum: int, frame: object) -> None:
        """Ctrl-C: a queued job (or one still starting) is cancelled; a running one gets SIGINT and is
        waited for."""
        self.interrupted = True
        if self.child is None:
            self.stop_requested = "interrupted by the user"
        elif self.tree is not None:  # to the group only while the command is unreaped
            self.tree.signal_group(signal.SIGINT)

    # -- the job's life --

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigint)
        # The terminal going away is not a reason to stop. A handler, not SIG_IGN: the command
        # would inherit an ignored signal.
        signal.signal(signal.SIGHUP, lambda signum, frame: None)
        me = psutil.Process()
        self._write("supervisor.json", {"pid": me.pid, "started": me.create_time(), "booted": since_boot(me)})
        saved = take_environment(self.dir)
        if saved is not None:  # started by systemd: the environment of whoever launched the job
            os.environ.clear()
            os.environ.update(saved)
        config = job_config(self.spec.config)
        self.health = job_health(config, self.spec_interval)
        # The job's claims and queue entry, handed over by its launcher: held until we end.
        shared = sharing_settings(self.spec.claims_dir, config.claims_idle_release_host)
        self.sharing = SupervisorSharing(shared, self.spec.id, self.spec.name, self.spec.gpu_spec,
                                         warn=lambda line: print(f"gpumon: {line}", file=sys.stderr, flush=True),
                                         min_free=self.spec.min_free)
        try:
            backend = open_backend(**self.spec.backend, health=self.health)
        except GpumonError as exc:
            self._finish("failed", f"could not reach the driver: {exc}")
            return 1
        try:
            try:
                gpus = self._choose_cards(backend)
            except GpumonError as exc:  # the cards chosen at launch are gone
                self._finish("failed", f"could not start: {exc}")
                return 1
            if gpus is None:
                asked = self.stop_requested or STOPPED
                self._finish("cancelled", "cancelled by the user" if asked == STOPPED else asked)
                return 0
            return self._run_attempts(backend, gpus)
        finally:
            self.sharing.release_all()
            backend.close()

    def _choose_cards(self, backend: Backend, count: int | None = None):
        """The job's cards: those chosen at launch, or (queued, or `count` cards to move to after a
        failure) the best free ones once they have been free for a few samples; None if stopped."""
        if self.spec.gpus and not self.spec.wait and count is None:
            # The UUIDs chosen at launch (cards or MIG slices).
            gpus = resolve_spec(",".join(self.spec.gpus), backend.sample())
            self.sharing.hold(gpus)
            return gpus
        gpu_spec = self.spec.gpu_spec if count is None else f"auto:{count}"
        min_free = self.spec.min_free or (str(self.spec.mem_limit) if self.spec.mem_limit else None)
        free = FreeCardsWait(gpu_spec, backend.topology(), min_free, self.spec.max_util, self.sharing)
        give_up = (time.monotonic() + self.spec.wait_timeout
                   if self.spec.wait_timeout is not None and count is None else None)
        told = None
        while self.stop_requested is None:
            snapshot = self.latest = backend.sample()
            if count is not None:  # moving: never to a card that failed
                snapshot = dataclasses.replace(
                    snapshot, gpus=tuple(g for g in snapshot.gpus if g.uuid not in self.failed_cards))

            if gpus := self.sharing.try_start(lambda taken: free.pick(taken, snapshot), snapshot.gpus,
                                              queued=count is None):
                return gpus
            if self.sharing.waiting_for != told:  # why it waits, for `jobs` and J
                told = self.sharing.waiting_for
                self._write(WAITING_RECORD, {"reason": told})
            if give_up is not None and time.monotonic() >= give_up:
                raise GpumonError(f"gave up waiting after {format_duration(self.spec.wait_timeout or 0)} "
                                  f"(--wait-timeout): {self.sharing.waiting_for or 'no free cards'}")
            self._pause(backend, self.spec_interval, cards=set())
        return None

    @property
    def spec_interval(self) -> float:
        return self.spec.interval

    def _run_attempts(self, backend: Backend, gpus) -> int:
        """Start the command; again on other cards while its card fails and moves are left."""
        why_moved = None
        while True:
            if not self._start(gpus, why_moved):
                return 1
            end = self._watch(backend, gpus)
            attempt = self.attempts[-1]
            attempt.ended, attempt.exit_code = time.time(), end.code if end.code >= 0 else None
            attempt.signal = signal.Signals(-end.code).name if end.code < 0 else None
            if not end.moves(self.spec.failover, self.stop_requested):
                self._save_attempts()
                self._record_end(end)
                return 0
            if len(self.attempts) > self.spec.failover:  # every move used: give up
                self._save_attempts()
                self._record_end(end, f"{end.trouble.reason}; not moved again: --failover {self.spec.failover} "
                                      f"allows {self.spec.failover} move{'s' if self.spec.failover != 1 else ''}")
                return 0
            attempt.moved_because = why_moved = end.trouble.reason
            self._save_attempts()
            # Until other cards are free the job is queued again: no command runs.
            self.records.pending.pop("process.json", None)
            try:
                (self.dir / "process.json").unlink(missing_ok=True)
            except OSError as exc:
                say(f"cannot remove process.json: {exc.strerror or exc}")
            self.child = None
            self.sharing.release_cards()  # the failed cards are not held while it waits for others
            gpus = self._choose_cards(backend, count=len(gpus))
            if gpus is None:
                self._finish("killed", f"{self.stop_requested or STOPPED} while waiting for cards to move to "
                                       f"(after {why_moved})")
                return 0

    def _record_end(self, end: AttemptEnd, why: str | None = None) -> None:
        self._finish(*end.record(self.spec.failover, why))

    def _start(self, gpus, why_moved: str | None) -> bool:
        """Pin and start the command on `gpus`; False (recorded as failed) if it cannot start."""
        pinning = pin(gpus, self.spec.id, self.spec.numa)
        env_added = dict(pinning.env)
        applied: list[str] = []
        # The job's own limit, or each card's default (`m`): on whichever cards it landed.
        limits = limits_for(gpus, self.spec.mem_limit, card_limits().load())
        self.limits = by_index(gpus, limits)
        if limits:
            extra, applied = limit_environment([limits.get(g.ref) for g in gpus], [g.memory_total or 0 for g in gpus],
                                               dict(os.environ))
            env_added.update(extra)
        number = len(self.attempts) + 1
        command, container = self._container_command(pinning, env_added, number,
                                                      [g.numa_node for g in gpus] if self.spec.numa else [])
        if container is not None:  # the hooks that read a host path do not reach inside
            applied = [a for a in applied if a != "pytorch"]
        self.spec = dataclasses.replace(
            self.spec, gpus=list(pinning.uuids), gpu_indices=list(pinning.indices), env_added=env_added,
            cpus=list(pinning.cpus) if pinning.cpus else None, limits_applied=applied,
            mem_limits={uuid: limits[g.ref] for uuid, g in zip(pinning.uuids, gpus) if g.ref in limits},
            container=container,
        )
        self._write("job.json", dataclasses.asdict(self.spec), indent=1)
        if pinning.cpus or self.attempts:  # inherited by the command (all of ours again, for cards without)
            os.sched_setaffinity(0, pinning.cpus or self.all_cpus)
        if self.spec.failover:
            self._mark_log(number, why_moved)
        if not self.records.retry():  # a command nobody could find (no job.json, no process.json): not started
            self._finish("failed", f"could not start: its records cannot be written ({self.records.problem})")
            return False
        started = time.time()  # the attempt's times are all on one clock (create_time is rounded)
        if (asked := self.stop_requested) is not None:  # Ctrl-C or a stop while it started up (or moved)
            self._finish("cancelled", "cancelled by the user" if asked == STOPPED else asked)
            return False
        try:
            inherited = {k: v for k, v in os.environ.items() if k not in pinning.unset}
            self.child = self._spawn(command, inherited | env_added)
        except OSError as exc:
            self._finish("failed", f"could not start {self.spec.command[0]!r}: {exc.strerror or exc}")
            return False
        self.tree = CommandTree(self.child, own_group=not self.foreground)
        if container is not None and container.get("cidfile"):
            self.container = ContainerFollow(container["engine"], container["engine_words"],
                                             Path(self.spec.cwd, container["cidfile"]), container["detached"],
                                             inherited | env_added, self.dir, self._tell, container["remote"])
        child = self.tree.root
        self._write("process.json", {"pid": child.pid, "started": child.create_time(), "booted": since_boot(child)})
        self.attempts.append(Attempt(number, list(pinning.uuids), list(pinning.indices), child.pid, started))
        self._save_attempts()
        if why_moved is not None:
            before = self.attempts[-2]
            job_events.append(FailoverEvent(
                host=self.spec.host or THIS_HOST, job=self.spec.id, name=self.spec.name,
                from_gpus=tuple(before.gpu_indices), from_uuids=tuple(before.gpus), to_gpus=pinning.indices,
                to_uuids=pinning.uuids, reason=why_moved, attempt=number, time=time.time()))
        return True

    def _save_attempts(self) -> None:
        self.records.write(ATTEMPTS_RECORD, attempts_json(self.attempts))

    def _tell(self, line: str) -> None:
        """A line for the user, in the job's output (`gpumon: …`)."""
        say(line)
        if self.foreground:
            print(f"gpumon: {line}", file=sys.stderr, flush=True)
        else:
            mark_log(self.dir / "output.log", f"gpumon: {line}\n")

    def _mark_log(self, number: int, why_moved: str | None) -> None:
        """Where each attempt begins, in the job's output."""
        line = banner(number, self.spec.failover + 1, self.spec.gpu_indices, self.spec.gpus, why_moved)
        if self.foreground:
            print(line, end="", file=sys.stderr, flush=True)
        else:
            mark_log(self.dir / "output.log", line)

    def _container_command(self, pinning, env_added: dict[str, str], number: int,
                           nodes: list[int | None]) -> tuple[list[str], dict | None]:
        """The command to run, with the pin added where it starts a container (jobs/container_command.py),
        and what was added, for the record."""
        located = locate(self.spec.command)
        if located is None:
            return list(self.spec.command), None
        found = located.container
        warning = check_cards(found, list(pinning.uuids), list(pinning.indices), as_typed=True)
        added = additions(found, list(pinning.uuids), env_added, pinning.cpus, self.dir / f"container-{number}.id",
                          keep_request=asked_cards(found) is not None, mems=usable_nodes(nodes),
                          indices=list(pinning.indices))
        env_added.update(added.env)
        if warning:
            self._tell(warning)
        return located.apply(self.spec.command, added.words), {
            "engine": found.engine, "engine_words": list(found.engine_words), "detached": found.detached,
            "remote": found.remote,
            "cidfile": added.cidfile, "summary": added.summary(found.engine), "warning": warning}

    def _spawn(self, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        if self.foreground:  # in the user's terminal, in its foreground process group (Ctrl-C works)
            return subprocess.Popen(command, cwd=self.spec.cwd, env=env)
        log = open(self.dir / "output.log", "ab", buffering=0)
        with open(os.devnull, "rb") as devnull:
            return subprocess.Popen(command, cwd=self.spec.cwd, env=env, stdin=devnull, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def _watch(self, backend: Backend, gpus) -> AttemptEnd:
        assert self.tree is not None
        cards = {g.index for g in gpus}  # a MIG slice's processes are listed on its card
        stopped: str | None = None
        trouble: Trouble | None = None
        blind_since: float | None = None  # since when the job's memory could not be read
        while not self._over():
            self.records.retry()
            if self.stop_requested:
                stopped = self.stop_requested
                self._stop_child()
                break
            snapshot: Snapshot | None = None
            try:
                snapshot = self.latest = backend.sample()
                pids = {p.pid for p in self._processes()}
                self.energy.see(snapshot, cards, pids)
                self.sharing.note_use(gpus)  # the user's reservation of these cards is in use
                self.sharing.keep_claims()  # someone removed one (the folder's owner can): made again
                used = job_memory(snapshot, cards, pids)
                blind = unwatched(snapshot, self.limits)
            except Exception as exc:  # noqa: BLE001 - whatever a sample raises, the watch goes on
                snapshot, blind = None, printable(str(exc))[:200] or type(exc).__name__
            blind_since = None if blind is None else blind_since or time.monotonic()
            if blind_since is not None and time.monotonic() - blind_since >= BLIND_S:
                stopped = f"stopped by gpumon: its memory limit could not be watched for {BLIND_S:g} s ({blind})"
                self._stop_child()
                break
            if snapshot is None:
                self._pause(backend, self.spec_interval, cards)
                continue
            peak = max(used.values(), default=0)
            if peak > self.peak:
                self.peak = peak
                self.records.write("peak", str(peak))
            if self.limits and (stopped := over_limit(used, self.limits)):
                self._stop_child()
                break
            trouble = trouble or self._note(card_trouble(snapshot, cards))
            if trouble is None or not self.spec.failover:
                found = self._pause(backend, self.spec_interval, cards)
                trouble = trouble or found
            if trouble is not None and self.spec.failover:  # what is left of the job: stopped
                stopped = trouble.reason
                self._stop_child()
                break
        code = self._reap()
        if self.container is not None:
            if self.container.detached and (ended := self.container.exit_code(GRACE_S)) is not None:
                code = ended  # the container's own end, not `run -d`'s
            self.container.close()
        if (last := self._sample(backend)) is not None:
            self.energy.see(last, cards, None)
        self.energy.attempt_ended()
        if code != 0 and stopped is None and trouble is None and self.spec.failover and last is not None:
            # Did it fail because its card did? NVML may say so a moment after the program noticed.
            trouble = self._note(card_trouble(last, cards)) or self._pause(
                backend, SETTLE_S, cards, while_running=False)
        return AttemptEnd(code, stopped, trouble)

    def _sample(self, backend: Backend) -> Snapshot | None:
        """A sample after the command ended; None if the driver cannot say (the end is recorded anyway)."""
        try:
            return backend.sample()
        except Exception as exc:  # noqa: BLE001
            say(f"cannot sample the cards after the job ended: {exc}")
            return None

    def _note(self, trouble: Trouble | None) -> Trouble | None:
        if trouble is not None and trouble.uuid:
            self.failed_cards.add(trouble.uuid)
        return trouble

    def _pause(self, backend: Backend, seconds: float, cards: set[int], while_running: bool = True) -> Trouble | None:
        """Sleep, listening for XIDs; wake up early when the command exits, a stop is asked for, or
        one of `cards` reports a fatal XID (returned)."""
        deadline = time.monotonic() + seconds
        xids_answer = backend.xid_events
        while (left := deadline - time.monotonic()) > 0 and not self.stop_requested:
            if while_running and self.tree is not None and self._over():
                break
            if not xids_answer:  # a backend without XIDs, or whose XIDs failed: just wait
                time.sleep(min(POLL_S, left))
                continue
            try:
                events = backend.wait_xid(min(POLL_S, left))
            except Exception:  # noqa: BLE001 - XIDs are not worth the watch: wait instead
                xids_answer, events = False, []
            for index, code in events:
                trouble = self._note(xid_trouble(self.latest, index, code, self.health, seen=self.xids_seen))
                if trouble is not None and index in cards:
                    return trouble
        return None

    def _over(self) -> bool:
        """The command has ended, and the container it started detached too."""
        assert self.tree is not None
        return self.tree.ended() and (self.container is None or not self.container.running())

    def _processes(self) -> list[psutil.Process]:
        """The command, what it started, and its container's processes (not its children)."""
        assert self.tree is not None
        found = self.tree.processes()
        return found + self.container.processes() if self.container is not None else found

    def _reap(self) -> int:
        assert self.child is not None and self.tree is not None
        try:
            return self.tree.reap(timeout=STUCK_S)
        except subprocess.TimeoutExpired:  # SIGKILLed but stuck in the driver: it never runs again
            say(f"pid {self.child.pid} has not ended {STUCK_S:.0f} s after SIGKILL")
            return -signal.SIGKILL

    def _stop_child(self) -> None:
        """SIGTERM to the command and what it started, SIGKILL to whatever is left after the grace.
        The command is not reaped until after both (`_reap`), so its group is still reachable."""
        assert self.tree is not None
        self.tree.signal(signal.SIGTERM)
        if self.container is not None and (problem := self.container.stop(GRACE_S)):
            say(problem)
            for proc in self.container.processes():  # what the engine would not stop
                try:
                    proc.kill()
                except psutil.Error:
                    pass
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and not self.tree.ended():
            time.sleep(0.05)
        self.tree.signal(signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m gpumon.jobs.supervision.supervisor JOB_DIR [--foreground]", file=sys.stderr)
        return 2
    directory = Path(argv[1]).absolute()
    # Its own folder, whoever started it (systemd too): nothing is left open in the caller's directory.
    os.chdir(directory)
    supervisor = Supervisor(directory, foreground="--foreground" in argv)
    try:
        code = supervisor.run()
    finally:  # the end of the job, once the disk has room for it
        supervisor.records.flush(FLUSH_S)
    if supervisor.foreground and supervisor.child is not None:
        return supervisor.child.returncode if supervisor.child.returncode >= 0 else 128 - supervisor.child.returncode
    if supervisor.foreground and supervisor.interrupted:  # cancelled by Ctrl-C: what a shell says of one
        return 128 + signal.SIGINT
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
