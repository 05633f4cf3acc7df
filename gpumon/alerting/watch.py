"""`gpumon watch`: sample, evaluate the alert rules, and send events to stdout, hooks and Prometheus.

Runs without a screen (systemd, cron, tmux). SIGTERM and SIGINT end it cleanly with status 0,
after the output is flushed and queued hooks have run. Outputs failing never stop alerting: a
closed stdout (`watch --metrics | head -1`) ends it quietly with status 0, as Unix tools do, and a
recording that cannot be written (a full disk) is reported once while rules and hooks go on.

Who used the cards goes to the usage ledger (`usage`: cli/watch.py passes gpumon/usage's recorder,
which never raises). Jobs that move to other cards (`run --failover`) are events too: `job_events` (the cli passes the
follower of the host's job event log, jobs/supervision/job_events.py) is asked for new ones once per sample.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpumon.alerting.events import EventWriter
from gpumon.alerting.hooks import HookRunner
from gpumon.alerting.rules import AlertEngine, AlertEvent, missing_cards
from gpumon.cards.recording import Recorder
from gpumon.cards.sampler import Sampler
from gpumon.errors import EXIT_ALERT, EXIT_OK, UsageError
from gpumon.exporter.fields import XID_COUNT_WINDOW_S
from gpumon.failover_event import FailoverEvent
from gpumon.model import GpuSample, Snapshot
from gpumon.sharing.folder import SharingSettings

if TYPE_CHECKING:
    from gpumon.exporter.web_config import WebConfig

log = logging.getLogger(__name__)
XID_POLL_S = 0.5
XID_KEPT = 1000  # the times kept of one card's one code within the count window: a storm counts up to this


@dataclass
class Watch:
    sampler: Sampler
    engine: AlertEngine
    writer: EventWriter
    hooks: HookRunner | None = None
    recorder: Recorder | None = None
    exit_on_alert: bool = False
    metrics: bool = False
    count: int | None = None
    job_events: Callable[[], list[FailoverEvent]] | None = None  # new job moves since the last call
    usage: Callable[[Snapshot], None] | None = None  # the usage ledger's recorder (cheap: it writes in a thread)
    status: int = EXIT_OK
    # (card, XID code) -> time of the newest; replaced whole, read by the exporter's thread.
    xid_seen: dict[tuple[int, int], float] = field(default_factory=dict)
    # (card, XID code) -> the times of each within the exporter's count window; replaced whole too.
    xid_recent: dict[tuple[int, int], tuple[float, ...]] = field(default_factory=dict)
    failure: UsageError | None = None  # a rule names a card this machine does not have
    xid_state: Any = None  # health.seen_xids.XidStateWriter: the XIDs heard, for `gpumon health`
    _cards_checked: bool = False
    _xid_stop: threading.Event = field(default_factory=threading.Event)

    def stop(self) -> None:
        self.sampler.stop()

    def serve_prometheus(self, address: str, processes: bool = False, hostname: str | None = None,
                         web: WebConfig | None = None, sharing: SharingSettings | None = None):
        # The exporter (prometheus_client, a WSGI server) only with --prometheus: a watch that only
        # alerts never loads it (tests/test_lazy_imports.py).
        from gpumon.exporter.collector import GpumonCollector
        from gpumon.exporter.serving import serve

        collector = GpumonCollector(lambda: self.sampler.latest, self.engine.firing, lambda: self.xid_seen, processes,
                                    hostname, lambda: self.xid_recent, sharing)
        return serve(address, collector, web)

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        self.sampler.subscribe(self._on_snapshot)
        xid_thread = None
        if self.sampler.backend is not None and self.sampler.backend.xid_events:
            xid_thread = threading.Thread(target=self._xid_loop, args=(loop,), name="gpumon-xid", daemon=True)
            xid_thread.start()
        try:
            await self.sampler.run(self.count)
        finally:
            self._xid_stop.set()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        if self.failure is not None:
            raise self.failure
        return self.status

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        if self.job_events is not None:  # a stat of one file; read only when it grew
            for moved in self.job_events():
                self._emit(moved)
        if snapshot.stale:  # the same data again: nothing new to record or evaluate
            return
        if not self._cards_checked:  # the first sample brings the card list the rules must match
            self._cards_checked = True
            if problem := missing_cards(self.engine.rules, snapshot):
                self.failure = UsageError(problem)
                self.stop()
                return
        if self.recorder is not None and (problem := self.recorder.write(snapshot)):
            log.error("%s", problem)
        if self.usage is not None:
            self.usage(snapshot)
        if self.metrics:
            self._output(self.writer.metrics, snapshot)
        for event in self.engine.evaluate(snapshot):
            self._emit(event)

    def _emit(self, event: AlertEvent | FailoverEvent) -> None:
        if self.hooks is not None:
            self.hooks.submit(event)
        self._output(self.writer.event, event)
        if self.exit_on_alert and event.event == "firing":
            self.status = EXIT_ALERT
            self.stop()

    def _output(self, write, item) -> None:
        """A line on stdout. When its reader has gone, watch ends quietly (queued hooks still run)."""
        write(item)
        if self.writer.closed:
            self.stop()

    def _xid_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        backend = self.sampler.backend
        while not self._xid_stop.is_set():
            for index, code in backend.wait_xid(XID_POLL_S):
                try:
                    loop.call_soon_threadsafe(self._on_xid, index, code, time.time())
                except RuntimeError:  # loop closed
                    return

    def _on_xid(self, index: int, code: int, when: float) -> None:
        self.xid_seen = {**self.xid_seen, (index, code): when}
        # Codes whose newest is past the window go; the one that came keeps its times within it.
        recent = {key: times for key, times in self.xid_recent.items() if when - times[-1] <= XID_COUNT_WINDOW_S}
        kept = tuple(t for t in recent.get((index, code), ()) if when - t <= XID_COUNT_WINDOW_S)
        recent[index, code] = (*kept[-XID_KEPT + 1:], when)
        self.xid_recent = recent
        latest = self.sampler.latest
        gpu = next((g for g in latest.gpus if g.index == index), None) if latest else None
        if self.xid_state is not None:
            self.xid_state.note(index, gpu.uuid if gpu else None, gpu.pci_bus_id if gpu else None, code, when)
        if gpu is None:
            gpu = GpuSample(index=index, uuid="", name="?", pci_bus_id="")
        for event in self.engine.xid(gpu, code, when):
            self._emit(dataclasses.replace(event, host=latest.host if latest else None))
