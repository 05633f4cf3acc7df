"""Running the admin's `--on-alert` command once per event, safely.

The command line is the admin's own and runs with `sh -c`; the event reaches it only as JSON on
stdin and as GPUMON_* environment variables, never pasted into the command, because card and
process names come from the driver and from other users. Hooks run in PARALLEL worker threads
(an alert's events always in order, on the same worker), so a slow hook never delays sampling or
the other alerts' hooks; one that hangs is killed after a timeout, and one that fails is reported
on stderr while the watch goes on. When the watch stops (SIGTERM), what is queued gets STOP_BUDGET_S
in all: a hook still running then is killed, and one that could not start in time is dropped, each
with a logged line, so a service manager never waits longer than that.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import zlib

from gpumon.alerting.alert_event import AlertEvent
from gpumon.failover_event import FailoverEvent
from gpumon.sharing.reservations import ReservationEvent

log = logging.getLogger(__name__)
QUEUE_LIMIT = 1000
PARALLEL = 4  # hooks at once
STOP_BUDGET_S = 10.0  # what queued hooks get when the watch stops (systemd's stop timeout is 90 s)


def hook_environment(event: AlertEvent | FailoverEvent) -> dict[str, str]:
    env = dict(os.environ)
    if isinstance(event, ReservationEvent):
        env.update({"GPUMON_EVENT": event.event, "GPUMON_HOST": event.host, "GPUMON_GPU": str(event.gpu),
                    "GPUMON_UUID": event.uuid, "GPUMON_USER": event.user, "GPUMON_NOTE": event.note,
                    "GPUMON_REASON": event.reason, "GPUMON_TIME": f"{event.time:.3f}"})
        return env
    if isinstance(event, FailoverEvent):
        env.update({
            "GPUMON_EVENT": event.event, "GPUMON_HOST": event.host, "GPUMON_JOB": event.job,
            "GPUMON_JOB_NAME": event.name, "GPUMON_FROM_GPU": ",".join(map(str, event.from_gpus)),
            "GPUMON_TO_GPU": ",".join(map(str, event.to_gpus)), "GPUMON_FROM_UUID": ",".join(event.from_uuids),
            "GPUMON_TO_UUID": ",".join(event.to_uuids), "GPUMON_REASON": event.reason,
            "GPUMON_ATTEMPT": str(event.attempt), "GPUMON_TIME": f"{event.time:.3f}",
        })
        return env
    env.update({
        "GPUMON_EVENT": event.event, "GPUMON_RULE": event.rule,
        "GPUMON_GPU": "" if event.gpu is None else str(event.gpu), "GPUMON_UUID": event.uuid or "",
        "GPUMON_HOST": event.host or "", "GPUMON_METRIC": event.metric, "GPUMON_VALUE": f"{event.value:g}",
        "GPUMON_THRESHOLD": f"{event.threshold:g}", "GPUMON_TIME": f"{event.time:.3f}",
        "GPUMON_NAME": event.name,
    })
    if event.error is not None:
        env["GPUMON_ERROR"] = event.error
    if event.metric == "health":  # the verdict's reasons, one a line: "code: what is wrong -> what fixes it"
        env["GPUMON_REASONS"] = "\n".join(f"{r.code}: {r.text} -> {r.action}" for r in event.reasons)
    if event.holder is not None:  # an idle rule: whom to write to, and about what
        h = event.holder
        env.update({
            "GPUMON_USER": h.user or "", "GPUMON_HOLDER": h.label, "GPUMON_HOLDER_KIND": h.kind,
            "GPUMON_HOLDER_ID": h.id, "GPUMON_GPUS": ",".join(map(str, h.cards)),
            "GPUMON_UUIDS": ",".join(u or "" for u in h.uuids), "GPUMON_GPU_MEMORY": str(h.gpu_memory or 0),
            "GPUMON_IDLE_S": "" if h.idle_s is None else f"{h.idle_s:.0f}",
        })
    if event.use is not None:  # an unclaimed rule: whose process, on whose card
        u = event.use
        env.update({
            "GPUMON_PID": str(u.pid), "GPUMON_USER": u.user or "", "GPUMON_HOLDER": u.holder,
            "GPUMON_HOLDER_KIND": u.kind, "GPUMON_DESCRIPTION": u.words(),
        })
    return env


def run_hook(command: str, event: AlertEvent | FailoverEvent, timeout: float,
             running: set[subprocess.Popen[bytes]] | None = None) -> int | None:
    """Run the hook for one event; its exit status, or None when it was killed (for hanging, or
    by whoever holds `running`, the set it is in while it runs)."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=sys.stderr.fileno(),
        env=hook_environment(event), start_new_session=True,  # its own group: killed whole on timeout
    )
    if running is not None:
        running.add(proc)
    try:
        return _wait_hook(proc, event, timeout)
    finally:
        if running is not None:
            running.discard(proc)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # gone already
        pass


def _wait_hook(proc: subprocess.Popen[bytes], event: AlertEvent | FailoverEvent, timeout: float) -> int | None:
    try:
        proc.communicate(json.dumps(event.to_dict()).encode() + b"\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        return None
    except BrokenPipeError:  # the hook did not read its stdin: fine
        proc.wait()
    return None if proc.returncode == -signal.SIGKILL else proc.returncode


class HookRunner:
    def __init__(self, command: str, timeout: float = 10.0, parallel: int = PARALLEL) -> None:
        self.command = command
        self.timeout = timeout
        self._queues: list[queue.Queue[AlertEvent | FailoverEvent | None]] = [queue.Queue() for _ in range(parallel)]
        self._deadline: float | None = None  # set by close(): when what is queued must be done
        self._running: set[subprocess.Popen[bytes]] = set()  # (set.add/discard: atomic under the GIL)
        self._cut = False  # close() killed what still ran at the deadline
        self._threads = [threading.Thread(target=self._work, args=(q,), name="gpumon-hooks", daemon=True)
                         for q in self._queues]
        for thread in self._threads:
            thread.start()

    def submit(self, event: AlertEvent | FailoverEvent) -> None:
        # One alert's events go to one worker: its `resolved` never overtakes its `firing`.
        key = _key(event)
        chosen = self._queues[zlib.crc32(key.encode()) % len(self._queues)]
        if chosen.qsize() >= QUEUE_LIMIT // len(self._queues):
            log.warning("hook queue full: %s dropped", _about(event))
            return
        chosen.put_nowait(event)

    def _work(self, events: queue.Queue[AlertEvent | FailoverEvent | None]) -> None:
        while (event := events.get()) is not None:
            timeout = self.timeout
            if self._deadline is not None:
                left = self._deadline - time.monotonic()
                if left <= 0 or self._cut:
                    log.warning("alert hook not run: the watch is stopping (%s)", _about(event))
                    continue
                timeout = min(self.timeout, left)
            try:
                status = run_hook(self.command, event, timeout, self._running)
            except OSError as exc:
                log.warning("alert hook could not start: %s", exc)
                continue
            if status is None and self._deadline is not None and time.monotonic() >= self._deadline - 0.05:
                log.warning("alert hook killed: the watch is stopping (%s)", _about(event))
            elif status is None:
                log.warning("alert hook killed after %gs (%s)", self.timeout, _about(event))
            elif status != 0:
                log.warning("alert hook exited with status %d (%s)", status, _about(event))

    def close(self, budget: float = STOP_BUDGET_S) -> None:
        """Let queued hooks run for `budget` seconds in all (each still bounded by its timeout);
        then what still runs is killed and what is left is dropped, and the workers stop."""
        self._deadline = time.monotonic() + budget
        for events in self._queues:
            events.put(None)
        for thread in self._threads:
            thread.join(max(0.0, self._deadline - time.monotonic()))
        self._cut = True
        for proc in list(self._running):  # started before the deadline was known: cut at it
            _kill_group(proc)
        for thread in self._threads:
            thread.join(1.0)


def _key(event: AlertEvent | FailoverEvent | ReservationEvent) -> str:
    if isinstance(event, FailoverEvent):
        return f"failover {event.host} {event.job}"
    if isinstance(event, ReservationEvent):
        return f"reservation {event.host} {event.uuid}"
    holder = event.holder.label if event.holder is not None else ""
    return f"{event.rule} {event.host} {event.gpu} {holder}"


def _about(event: AlertEvent | FailoverEvent | ReservationEvent) -> str:
    if isinstance(event, ReservationEvent):
        return f"event {event.event} of GPU {event.gpu}"
    if isinstance(event, FailoverEvent):
        return f"event failover of job {event.job}"
    if event.holder is not None:
        return f"event {event.event} of {event.holder.label} ({event.rule})"
    return f"event {event.event} on GPU {event.gpu} ({event.rule})"
