"""The supervisor of one job: `python -m gpumon.jobs.supervisor JOB_DIR [--foreground]`.

It waits for a free card when the job is queued, pins and starts the command, watches its GPU
memory per card (the limit's guarantee), and records how it ended: `exited`, `killed` (by gpumon,
or by a signal, which is named), `failed` (could not start, with the reason) or `cancelled`
(stopped while queued). SIGTERM asks it to stop the job: SIGTERM to the command's process group,
SIGKILL after a grace period. SIGINT (Ctrl-C) is forwarded to a detached command (a foreground one
gets it from the terminal itself); the supervisor waits for the command and records the end either
way. It is single-threaded, so it can set its own CPU affinity before starting the command, which
inherits it (no preexec_fn).
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

from gpumon.errors import GpumonError
from gpumon.jobs.limits import limit_environment, over_limit
from gpumon.jobs.placement import free_enough, pin, resolve_spec
from gpumon.jobs.processes import since_boot
from gpumon.jobs.records import JobSpec, take_environment, write_atomic
from gpumon.model import Snapshot
from gpumon.monitor.backends import Backend, open_backend

GRACE_S = 5.0
FREE_SAMPLES_IN_A_ROW = 3
STOPPED = "stopped by the user"


class Supervisor:
    def __init__(self, directory: Path, foreground: bool) -> None:
        self.dir = directory
        self.foreground = foreground
        self.spec = JobSpec.from_dict(json.loads((directory / "job.json").read_text()))
        self.stop_requested: str | None = None
        self.child: subprocess.Popen | None = None
        self.peak = 0

    # -- records --

    def _write(self, name: str, data: dict) -> None:
        write_atomic(self.dir / name, json.dumps(data))

    def _finish(self, state: str, reason: str | None, exit_code: int | None = None, sig: int | None = None) -> None:
        self._write("exit.json", {"state": state, "exit_code": exit_code, "signal": sig, "ended": time.time(),
                                  "reason": reason})

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.stop_requested = STOPPED

    def _on_sigint(self, signum: int, frame: object) -> None:
        """Ctrl-C: a queued job is cancelled; a running one gets SIGINT and is waited for."""
        if self.child is None:
            self.stop_requested = "interrupted by the user"
        elif not self.foreground and self.child.returncode is None:
            try:  # not reaped yet: the group id cannot have been reused
                os.killpg(self.child.pid, signal.SIGINT)
            except OSError:
                pass

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
        try:
            backend = open_backend(**self.spec.backend)
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
            return self._start_and_watch(backend, gpus)
        finally:
            backend.close()

    def _choose_cards(self, backend: Backend):
        if self.spec.gpus and not self.spec.wait:
            # The UUIDs chosen at launch (cards or MIG slices).
            return resolve_spec(",".join(self.spec.gpus), backend.sample())
        min_free = self.spec.min_free or (str(self.spec.mem_limit) if self.spec.mem_limit else None)
        topo = backend.topology()
        streak: tuple[tuple[str, ...], int] = ((), 0)
        while self.stop_requested is None:
            snapshot = backend.sample()
            try:
                gpus = resolve_spec(self.spec.gpu_spec, snapshot, topo, min_free, self.spec.max_util)
                free = all(free_enough(g, min_free, self.spec.max_util) is None for g in gpus)
            except GpumonError:
                gpus, free = [], False
            uuids = tuple(g.uuid for g in gpus)
            streak = (uuids, streak[1] + 1 if free and uuids == streak[0] else (1 if free else 0))
            if streak[1] >= FREE_SAMPLES_IN_A_ROW:
                return gpus
            time.sleep(self.spec_interval)
        return None

    @property
    def spec_interval(self) -> float:
        return self.spec.interval

    def _start_and_watch(self, backend: Backend, gpus) -> int:
        pinning = pin(gpus, self.spec.id, self.spec.numa)
        env_added = dict(pinning.env)
        applied: list[str] = []
        if self.spec.mem_limit:
            extra, applied = limit_environment(self.spec.mem_limit, [g.memory_total or 0 for g in gpus], dict(os.environ))
            env_added.update(extra)
        self.spec = dataclasses.replace(
            self.spec, gpus=list(pinning.uuids), gpu_indices=list(pinning.indices), env_added=env_added,
            cpus=list(pinning.cpus) if pinning.cpus else None, limits_applied=applied,
        )
        write_atomic(self.dir / "job.json", json.dumps(dataclasses.asdict(self.spec), indent=1))
        if pinning.cpus:
            os.sched_setaffinity(0, pinning.cpus)  # inherited by the command
        try:
            self.child = self._spawn(dict(os.environ) | env_added)
        except OSError as exc:
            self._finish("failed", f"could not start {self.spec.command[0]!r}: {exc.strerror or exc}")
            return 1
        child = psutil.Process(self.child.pid)
        self._write("process.json", {"pid": child.pid, "started": child.create_time(), "booted": since_boot(child)})
        return self._watch(backend, gpus)

    def _spawn(self, env: dict[str, str]) -> subprocess.Popen:
        if self.foreground:  # in the user's terminal, in its foreground process group (Ctrl-C works)
            return subprocess.Popen(self.spec.command, cwd=self.spec.cwd, env=env)
        log = open(self.dir / "output.log", "ab", buffering=0)
        with open(os.devnull, "rb") as devnull:
            return subprocess.Popen(self.spec.command, cwd=self.spec.cwd, env=env, stdin=devnull, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)

    def _watch(self, backend: Backend, gpus) -> int:
        assert self.child is not None
        cards = {g.index for g in gpus}  # a MIG slice's processes are listed on its card
        reason = None
        while self.child.poll() is None:
            if self.stop_requested:
                reason = self.stop_requested
                self._stop_child()
                break
            used = self._job_gpu_memory(backend.sample(), cards)
            peak = max(used.values(), default=0)
            if peak > self.peak:
                self.peak = peak
                write_atomic(self.dir / "peak", str(peak))
            if self.spec.mem_limit and (reason := over_limit(used, self.spec.mem_limit)):
                self._stop_child()
                break
            self._sleep(self.spec_interval)
        code = self.child.wait()
        sig = -code if code < 0 else None
        state = "killed" if reason or sig else "exited"
        self._finish(state, reason, code if code >= 0 else None, sig)
        return 0

    def _sleep(self, seconds: float) -> None:
        """Sleep, but wake up early when the command exits or a stop is asked for."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.child.poll() is None and not self.stop_requested:
            time.sleep(min(0.05, seconds))

    def _job_processes(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.child.pid)
            return [root] + root.children(recursive=True)
        except psutil.Error:
            return []

    def _job_gpu_memory(self, snapshot: Snapshot, cards: set[int]) -> dict[int, int]:
        """Per card, the GPU memory of the job's own processes; other users' processes never count."""
        pids = {p.pid for p in self._job_processes()}
        return {g.index: sum(p.gpu_memory or 0 for p in g.processes if p.pid in pids)
                for g in snapshot.gpus if g.index in cards}

    def _stop_child(self) -> None:
        """SIGTERM to the command and what it started, SIGKILL to whatever is left after the grace."""
        assert self.child is not None
        family = self._job_processes()
        self._signal_all(family, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and self.child.poll() is None:
            time.sleep(0.05)
        self._signal_all(family + self._job_processes(), signal.SIGKILL)

    def _signal_all(self, processes: list[psutil.Process], sig: int) -> None:
        # The command's own group, only while the command is not reaped: until then its pid (the
        # group's id) cannot belong to anyone else.
        if not self.foreground and self.child.returncode is None:
            try:
                os.killpg(self.child.pid, sig)
            except OSError:
                pass
        for proc in processes:  # and anything that left the group; psutil refuses recycled pids
            try:
                proc.send_signal(sig)
            except psutil.Error:
                pass


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m gpumon.jobs.supervisor JOB_DIR [--foreground]", file=sys.stderr)
        return 2
    supervisor = Supervisor(Path(argv[1]), foreground="--foreground" in argv)
    code = supervisor.run()
    if supervisor.foreground and supervisor.child is not None:
        return supervisor.child.returncode if supervisor.child.returncode >= 0 else 128 - supervisor.child.returncode
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
