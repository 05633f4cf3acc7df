"""Running the admin's `--on-alert` command once per event, safely.

The command line is the admin's own and runs with `sh -c`; the event reaches it only as JSON on
stdin and as GPUMON_* environment variables, never pasted into the command, because card and
process names come from the driver and from other users. Hooks run one at a time in a worker
thread, so a slow hook never delays sampling; one that hangs is killed after a timeout, and one
that fails is reported on stderr while the watch goes on.
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

from gpumon.alerting.alert_event import AlertEvent
from gpumon.model import FailoverEvent
from gpumon.sharing.reservations import ReservationEvent

log = logging.getLogger(__name__)
QUEUE_LIMIT = 1000


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
    return env


def run_hook(command: str, event: AlertEvent | FailoverEvent, timeout: float) -> int | None:
    """Run the hook for one event; its exit status, or None when it was killed for hanging."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command], stdin=subprocess.PIPE, stdout=sys.stderr.fileno(),
        env=hook_environment(event), start_new_session=True,  # its own group: killed whole on timeout
    )
    try:
        proc.communicate(json.dumps(event.to_dict()).encode() + b"\n", timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None
    except BrokenPipeError:  # the hook did not read its stdin: fine
        proc.wait()
    return proc.returncode


class HookRunner:
    def __init__(self, command: str, timeout: float = 10.0) -> None:
        self.command = command
        self.timeout = timeout
        self._queue: queue.Queue[AlertEvent | FailoverEvent | None] = queue.Queue(QUEUE_LIMIT)
        self._thread = threading.Thread(target=self._work, name="gpumon-hooks", daemon=True)
        self._thread.start()

    def submit(self, event: AlertEvent | FailoverEvent) -> None:
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            log.warning("hook queue full: %s dropped", _about(event))

    def _work(self) -> None:
        while (event := self._queue.get()) is not None:
            try:
                status = run_hook(self.command, event, self.timeout)
            except OSError as exc:
                log.warning("alert hook could not start: %s", exc)
                continue
            if status is None:
                log.warning("alert hook killed after %gs (%s)", self.timeout, _about(event))
            elif status != 0:
                log.warning("alert hook exited with status %d (%s)", status, _about(event))

    def close(self, wait: float | None = None) -> None:
        """Let queued hooks finish (each still bounded by the timeout), then stop the worker."""
        self._queue.put(None)
        self._thread.join(wait)


def _about(event: AlertEvent | FailoverEvent | ReservationEvent) -> str:
    if isinstance(event, ReservationEvent):
        return f"event {event.event} of GPU {event.gpu}"
    if isinstance(event, FailoverEvent):
        return f"event failover of job {event.job}"
    if event.holder is not None:
        return f"event {event.event} of {event.holder.label} ({event.rule})"
    return f"event {event.event} on GPU {event.gpu} ({event.rule})"
