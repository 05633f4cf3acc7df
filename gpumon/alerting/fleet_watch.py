"""`gpumon watch --hosts`: the alert rules on every card of every host, and `unreachable` per host.

Each host has its own rule engine (cards are numbered per host), fed each new document the host
sends; every event carries `"host"`, and hooks get it as GPUMON_HOST. `unreachable` fires when a
host cannot be read (no connection, or it answers with something unusable: `"error"` says why) for
the rule's duration, and resolves when it is back. One host's trouble never delays another's
events. Hosts a source finds as it goes (Prometheus) get their engine when they first report. A
source that cannot read its hosts (Prometheus down) says so once on stderr, and again when it
changes. `--count N` ends the watch after N intervals, with the fleet commands' exit status: 0
every host was read at least once meanwhile, 4 some never was, 5 none was (1 instead where
`--exit-on-alert` saw an alert). SIGTERM and SIGINT end it cleanly with 0, and so does stdout's
reader going away (queued hooks still run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time

from gpumon.alerting.events import EventWriter
from gpumon.alerting.hooks import HookRunner
from gpumon.alerting.rules import AlertEngine, AlertEvent, Rule, missing_cards
from gpumon.errors import EXIT_ALERT, EXIT_NONE_READ, EXIT_OK, answered_status
from gpumon.exporter.collector import FleetCollector, Reading
from gpumon.exporter.serving import serve
from gpumon.exporter.web_config import WebConfig
from gpumon.fleet import Fleet
from gpumon.model import HostStatus, Snapshot

AWAY = ("unreachable", "reconnecting", "error")
ANSWERS = ("live", "stale")  # gpumon_host_up 1: the host is read (stale: it has gone quiet for a while)
log = logging.getLogger(__name__)


class FleetWatch:
    def __init__(self, fleet: Fleet, rules: list[Rule], writer: EventWriter, hooks: HookRunner | None = None,
                 exit_on_alert: bool = False, metrics: bool = False, count: int | None = None) -> None:
        self.fleet = fleet
        self.rules = rules
        self.engines = {name: AlertEngine(rules) for name in fleet.names}  # and the hosts found later
        self.host_engine = AlertEngine(rules)
        self.writer = writer
        self.hooks = hooks
        self.exit_on_alert = exit_on_alert
        self.metrics = metrics
        self.count = count
        self.status = EXIT_OK
        self._seen: dict[str, Snapshot] = {}
        self._problems: tuple[str, ...] = ()
        self._cards_checked: set[str] = set()
        self._read: set[str] = set()  # hosts that sent a reading during the watch
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    def serve_prometheus(self, address: str, processes: bool = False, web: WebConfig | None = None):
        """One exporter for the whole fleet: nothing is installed on the nodes. Hosts read through
        Prometheus are left out: their series are in Prometheus already. `web`: TLS and basic auth."""
        return serve(address, FleetCollector(self._readings, processes, alerts=True), web)

    def _readings(self) -> tuple[list[Reading], dict[str, bool]]:
        """For the exporter's thread: the fleet's statuses and the engines' published copies."""
        readings: list[Reading] = []
        up: dict[str, bool] = {}
        for status in self.fleet.statuses():
            if status.source == "prometheus":
                continue
            up[status.host] = status.state in ANSWERS and status.snapshot is not None
            if up[status.host]:
                engine = self.engines.get(status.host)
                readings.append(Reading(status.host, status.snapshot, engine.firing() if engine else None))
        return readings, up

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        self.fleet.subscribe(self._on_host)
        runner = asyncio.create_task(self.fleet.run())
        ticks = 0
        try:
            while not self._stop.is_set() and (self.count is None or ticks < self.count):
                try:
                    async with asyncio.timeout(self.fleet.interval):
                        await self._stop.wait()
                except TimeoutError:
                    pass
                ticks += 1
                self._say_problems()
                now = time.time()
                for status in self.fleet.statuses():  # durations of `unreachable for …` run on time
                    self._check_host(status, now)
        finally:
            self.fleet.stop()
            await runner
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
        if not self._stop.is_set() and self.status == EXIT_OK:  # it ended by itself (--count)
            if self.fleet.names:
                return answered_status(name in self._read for name in self.fleet.names)
            return EXIT_NONE_READ if self._problems else EXIT_OK  # (Prometheus, which found no host)
        return self.status

    def _on_host(self, status: HostStatus) -> None:
        snapshot = status.snapshot
        if status.state in ANSWERS and snapshot is not None:
            self._read.add(status.host)
        if status.state == "live" and snapshot is not None and snapshot is not self._seen.get(status.host):
            self._seen[status.host] = snapshot
            if self.metrics:
                self.writer.metrics(snapshot, host=status.host)
                self._stop_when_unread()
            engine = self.engines.get(status.host)
            if engine is None:
                engine = self.engines[status.host] = AlertEngine(self.rules)
            if status.host not in self._cards_checked:  # cards differ per host: a warning, not an error
                self._cards_checked.add(status.host)
                if problem := missing_cards(self.rules, snapshot, where=status.host):
                    log.warning("%s", problem)
            for event in engine.evaluate(snapshot):
                self._emit(dataclasses.replace(event, host=status.host))
        self._check_host(status, time.time())

    def _say_problems(self) -> None:
        problems = self.fleet.problems()
        for problem in problems:
            if problem not in self._problems:
                log.warning("%s", problem)
        self._problems = problems

    def _check_host(self, status: HostStatus, now: float) -> None:
        # Stale without a reading: it let ssh in but has sent nothing since (a hung driver there).
        away = status.state in AWAY or (status.state == "stale" and status.snapshot is None)
        for event in self.host_engine.evaluate_host(status.host, away, now, status.error if away else None):
            self._emit(event)

    def _emit(self, event: AlertEvent) -> None:
        self.writer.event(event)
        if self.hooks is not None:
            self.hooks.submit(event)
        if self.exit_on_alert and event.event == "firing":
            self.status = EXIT_ALERT
            self.stop()
        self._stop_when_unread()

    def _stop_when_unread(self) -> None:
        """stdout's reader has gone (`watch --hosts … | head -1`): end quietly, as Unix tools do."""
        if self.writer.closed:
            self.stop()
