"""A whole cluster read through its Prometheus server (`--prometheus-url`), read-only.

Each refresh (every 5 s unless --interval says otherwise) asks Prometheus' HTTP API the four
questions of `dcgm.queries()` at once — the same four for one host or four thousand — and reports
every host found in the answers to the fleet, adding the ones it has not seen before. The answers
are read and turned into snapshots in daemon threads (`prometheus_api`; a hung server never keeps
gpumon from exiting).

States of a host read this way (`HostStatus.source` "prometheus"):
  live         its newest samples are recent
  stale        its newest samples are older than three of its scrape intervals (measured from the
               samples' own times; until then, 90 s), or it has no series any more (its exporter
               stopped: Prometheus dropped them; a failing scrape target is named), or gpumon's
               exporter there has had no new sample for that long. The last reading stays.
  unreachable  Prometheus itself cannot be read (why: connection refused, timeout, an HTTP error,
               an answer that is not Prometheus' JSON); tried again after the interval, doubling
               up to 30 s.
Nothing can be launched, listed or signalled on such a host: Prometheus has no way to reach the node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial

from gpumon.cards.sampler import run_in_daemon_thread as in_daemon_thread
from gpumon.fleet.fleet import Source
from gpumon.fleet.prometheus.api import REQUEST_TIMEOUT_S, ApiError, parse_url, query
from gpumon.fleet.prometheus.dcgm import Cluster, queries, read_cluster
from gpumon.fleet.prometheus.login import login
from gpumon.health.rules import HealthSettings
from gpumon.sanitize import printable

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0
STALE_SCRAPES = 3
UNKNOWN_SCRAPE_S = 30.0  # until two samples of a host have been seen
STALE_MIN_S = 2.0
BACKOFF_MAX_S = 30.0
NOTE = "read through Prometheus: no way to reach the node"


class PrometheusSource(Source):
    """Every host a Prometheus server has GPU series of (dcgm-exporter's or gpumon's), read-only."""

    kind = "prometheus"
    finds_hosts = True

    def __init__(self, url: str, interval: float = DEFAULT_INTERVAL_S, timeout: float = REQUEST_TIMEOUT_S,
                 user: str | None = None, password_file: str | None = None,
                 health: HealthSettings = HealthSettings()) -> None:
        """`user`, `password_file`: the config's, for a server that demands a login (prometheus_login);
        `health`: the config's [health], by which the cards' verdicts are drawn."""
        self.health = health
        self.server = login(parse_url(url), user, password_file)
        self.url = self.server.url  # without the login
        self.label = f"Prometheus at {self.url}"
        self.interval = interval
        self.timeout = timeout
        self.hosts: list[str] = []  # found so far, in the order found
        self._mine: set[str] = set()
        self._foreign: set[str] = set()  # names another source of the fleet reads
        self._instances: dict[str, set[str]] = {}  # host -> the scrape targets it came from
        self._jobs: set[str] = set()  # scrape jobs GPU series came from
        self._split: set[str] = set()  # host names two machines report (dcgm.host_names)
        self._newest: dict[str, float] = {}  # host -> time of its newest sample seen
        self._gap: dict[str, float] = {}  # host -> shortest time between two new samples seen
        self._readings: dict[str, tuple] = {}  # host -> (which samples, its snapshot): reused until new ones
        self.last_bytes = 0  # received by the last refresh (for benchmarks)
        self._said_dropped = False

    async def read(self) -> Cluster:
        """One refresh: the queries at once, each in a daemon thread; ApiError says why it failed."""
        questions = queries(self._jobs)
        asked = [in_daemon_thread(partial(query, self.server, promql, self.timeout)) for promql in questions.values()]
        try:
            answers = await asyncio.gather(*asked)
        except BaseException:
            for future in asked:
                future.cancel()
            raise
        self.last_bytes = sum(size for _, _, size in answers)
        by_name = dict(zip(questions, answers, strict=True))
        when = next((t for t, _, _ in answers if t is not None), None) or time.time()
        return await in_daemon_thread(partial(read_cluster, when, by_name["cards"][1], by_name["values"][1],
                                              by_name["processes"][1], by_name["targets"][1], self._readings,
                                              frozenset(self._split), self.health))

    async def run(self, fleet) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            started = loop.time()
            try:
                cluster = await self.read()
            except ApiError as exc:
                failures += 1
                delay = min(BACKOFF_MAX_S, self.interval * 2 ** (failures - 1))
                self._unreachable(fleet, printable(str(exc)), time.time() + delay)
            else:
                failures = 0
                delay = self.interval
                self.publish(fleet, cluster)
            await asyncio.sleep(max(0.0, started + delay - loop.time()))

    def stale_after(self, host: str) -> float:
        return max(STALE_SCRAPES * self._gap.get(host, UNKNOWN_SCRAPE_S), STALE_MIN_S)

    def _unreachable(self, fleet, why: str, retry_at: float) -> None:
        for name in self.hosts:
            fleet.report(name, "unreachable", source=self.kind, error=f"{self.label}: {why}", retry_at=retry_at)
        fleet.source_read(self, why)

    def publish(self, fleet, cluster: Cluster) -> None:
        """Report what one refresh found: every host's state and reading."""
        self._jobs |= cluster.jobs
        self._split |= cluster.split
        for name, host in cluster.hosts.items():
            if name in self._foreign or not self._known(fleet, name):
                continue
            self._instances[name] = host.instances
            newest = host.newest
            previous = self._newest.get(name)
            if previous is not None and newest > previous:
                self._gap[name] = min(self._gap.get(name, newest - previous), newest - previous)
            self._newest[name] = max(newest, previous or 0.0)
            limit = self.stale_after(name)
            if cluster.time - newest > limit:
                state, why = "stale", f"no new data in Prometheus for over {limit:.0f} s"
            elif host.sample_age is not None and host.sample_age > limit:
                state, why = "stale", f"its gpumon has had no new reading for over {limit:.0f} s"
            else:
                state, why = "live", None
            reading = host.reading or host.snapshot(self.health)
            self._readings[name] = (host.scrape, reading)
            fleet.report(name, state, snapshot=reading, source=self.kind, error=why, note=NOTE)
        for name in self.hosts:
            if name not in cluster.hosts:
                fleet.report(name, "stale", source=self.kind, error=self._gone(name, cluster), note=NOTE)
        if cluster.dropped_hosts and not self._said_dropped:
            self._said_dropped = True
            log.warning("%s: %d hosts over the limit are not shown", self.label, cluster.dropped_hosts)
        problem = None
        if not self.hosts:
            problem = ("no GPU series (dcgm-exporter's DCGM_FI_DEV_* or gpumon watch --prometheus): "
                       "does it scrape a GPU exporter?")
        fleet.source_read(self, problem)

    def _known(self, fleet, name: str) -> bool:
        if name in self._mine:
            return True
        if not fleet.add_host(name, self, note=NOTE):
            self._foreign.add(name)  # listed for ssh too: that reading wins
            return False
        self._mine.add(name)
        self.hosts.append(name)
        return True

    def _gone(self, name: str, cluster: Cluster) -> str:
        """Why a host it had before has no series now; names its scrape targets that fail."""
        down = [f"{i} (job {cluster.down[i]})" for i in sorted(self._instances.get(name, ())) if i in cluster.down]
        if down:
            return "no data in Prometheus any more: its exporter is down (" + ", ".join(down) + ")"
        return "no data in Prometheus any more: its exporter stopped, or is no longer scraped"


__all__ = ["DEFAULT_INTERVAL_S", "NOTE", "ApiError", "PrometheusSource", "parse_url"]
