"""The fleet: every host's latest `HostStatus`, written by sources, read by views.

A *source* reads one or more hosts and reports what it learns (`Fleet.report`); the fleet keeps
the newest status per host and tells its subscribers which host changed. Sources are pluggable
(`Source`): `SshSource` (one gpumon stream per host, nvidia-smi as the fallback), `LocalSource`
(this machine's own backend) and `PrometheusSource` (every host a Prometheus server has GPU series
of). A source may find hosts as it goes (`add_host`: Prometheus learns them from its data); a
listener then hears of a host it has not seen before, which is how views learn of new hosts.
Everything runs on one asyncio loop; no source can stall another, and nothing here costs more than
O(1) per report of a known host, so a view redraws only the hosts that changed.

For views (the TUI):
    fleet = open_fleet(hosts, transport, interval, local_backend)
    fleet.subscribe(on_host)            # called on the loop with the HostStatus that changed
    worker = run_worker(fleet.run())    # until fleet.stop()
    fleet.status("gpu01"), fleet.statuses(), fleet.document()   # any time, from any thread
    fleet.problems()                    # why a source that finds its hosts (Prometheus) cannot read them
    fleet.history("gpu01")              # charts of one host (kept from the first call on)

Views act on a host through jobs/host.py (`host_for(fleet, "gpu01")`), never through the fleet:
it only reads. It keeps how each listed host is reached (`specs`, `transport`, `local_args`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from gpumon.cards.sampler import History
from gpumon.model import FleetSnapshot, HostStatus
from gpumon.remote.hosts import HostSpec
from gpumon.remote.ssh import SshTransport

log = logging.getLogger(__name__)

Listener = Callable[[HostStatus], None]
SETTLED = ("live", "stale", "unreachable", "error")  # a first answer, good or bad
_KEEP: Any = object()


class Source(ABC):
    """What reads hosts for the fleet (subclass it): SshSource, LocalSource, PrometheusSource.

    A source that finds its hosts as it reads (Prometheus) sets `finds_hosts`: it calls
    `fleet.add_host` before a host's first report, and `fleet.source_read(self, problem)` after
    every read of all of them; its `label` names it for people in what goes wrong."""

    kind: str = "gpumon"  # "gpumon" | "nvidia-smi" | "prometheus" | "local": what it reads hosts through
    hosts: Sequence[str] = ()  # the names of the hosts it reports (so far, for a source that finds them)
    finds_hosts: bool = False
    label: str = ""  # for people: "Prometheus at http://prom:9090" ("": its kind)

    @abstractmethod
    async def run(self, fleet: Fleet) -> None:
        """Report the hosts' statuses until cancelled; never raises for a host's trouble."""


class Fleet:
    def __init__(self, hosts: Sequence[HostSpec], sources: Sequence[Source], interval: float,
                 transport: SshTransport | None = None, local_args: Sequence[str] = (),
                 history_seconds: float = 600.0, clock: Callable[[], float] = time.time) -> None:
        """`clock`: unix time now (a frozen one for screenshots)."""
        self.clock = clock
        self.specs = {spec.name: spec for spec in hosts}
        self.names = tuple(self.specs)  # listed hosts first, then found ones in the order found
        self.sources = list(sources)
        self.interval = interval
        self.transport = transport
        self.local_args = list(local_args)
        self.history_seconds = history_seconds
        self._owner: dict[str, Source] = {}
        for source in self.sources:
            for name in source.hosts:
                self._owner.setdefault(name, source)
        now = clock()
        self._status = {name: HostStatus(name, since=now, source=self._kind_of(name)) for name in self.names}
        self._listeners: list[Listener] = []
        self._histories: dict[str, History] = {}
        self._unsettled = set(self.names)
        self._unread = {id(s) for s in self.sources if s.finds_hosts}  # no first read yet
        self._problems: dict[str, str] = {}  # a finding source's label -> why it cannot read its hosts
        self._first: dict[str, HostStatus] = {}  # each host's first answer (or failure)
        self._answer_listeners: list[Listener] = []
        self._settled = asyncio.Event()
        self._stop = asyncio.Event()
        self.version = 0  # grows with every report: a view compares it to skip work

    def _kind_of(self, name: str) -> str:
        owner = self._owner.get(name)
        return owner.kind if owner is not None else "gpumon"

    # -- reading (any thread) --

    def status(self, name: str) -> HostStatus:
        return self._status[name]

    def statuses(self) -> tuple[HostStatus, ...]:
        """Every host, in the order they were listed."""
        return tuple(self._status[name] for name in self.names)

    def document(self) -> FleetSnapshot:
        return FleetSnapshot(self.clock(), self.statuses())

    def first_answers(self) -> FleetSnapshot:
        """Each host as it first answered or failed (after settle(): what a one-shot command shows,
        not the retry that may have begun since)."""
        return FleetSnapshot(self.clock(), tuple(self._first.get(n, self._status[n]) for n in self.names))

    def history(self, name: str) -> History:
        """Chart history of one host, kept from the first call on (hosts nobody looks at keep none)."""
        if name not in self._histories:
            self._histories[name] = History(capacity=int(self.history_seconds / max(self.interval, 0.1)) + 1)
            snapshot = self._status[name].snapshot
            if snapshot is not None:
                self._histories[name].add(snapshot)
        return self._histories[name]

    def problems(self) -> tuple[str, ...]:
        """Why a source that finds its hosts cannot read them now, one line each (none: all is well).
        Its hosts say so too (unreachable); this also covers a source that has found none yet."""
        return tuple(f"{label}: {why}" for label, why in self._problems.items())

    # -- writing (sources, on the loop) --

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def on_first_answer(self, listener: Listener) -> None:
        """`listener(status)` once per host, with its first answer or failure (what first_answers()
        will say of it), as it comes: a one-shot command prints each host as it arrives."""
        self._answer_listeners.append(listener)

    def _answered(self, name: str, status: HostStatus) -> None:
        self._first[name] = status
        if name in self._unsettled:
            self._unsettled.discard(name)
            self._check_settled()
        for listener in list(self._answer_listeners):
            try:
                listener(status)
            except Exception:
                log.exception("fleet answer listener failed")

    def add_host(self, name: str, source: Source, note: str | None = None) -> bool:
        """A source found a host. False when another source reads a host of that name (the one
        listed or found first keeps it; the finder should not report it). O(hosts), once per host."""
        owner = self._owner.get(name)
        if owner is not None:
            return owner is source
        self._owner[name] = source
        self._status[name] = HostStatus(name, since=self.clock(), source=source.kind, note=note)
        self.names = self.names + (name,)
        self.version += 1
        return True

    def source_read(self, source: Source, problem: str | None) -> None:
        """A finding source read all its hosts (problem None), or could not (why, in words)."""
        label = source.label or source.kind
        if problem is None:
            changed = self._problems.pop(label, None) is not None
        else:
            changed = self._problems.get(label) != problem
            self._problems[label] = problem
        if changed:
            self.version += 1
        if id(source) in self._unread:
            self._unread.discard(id(source))
            self._check_settled()

    def _check_settled(self) -> None:
        if not self._unsettled and not self._unread:
            self._settled.set()

    def report(self, name: str, state: str, *, snapshot: Any = _KEEP, error: str | None = None,
               source: str | None = None, note: Any = _KEEP, retry_at: float | None = None,
               taken: Any = _KEEP, mine: Any = _KEEP) -> None:
        """A source's news about one host. `snapshot`/`note`/`taken`/`mine` left out: keep the ones it had."""
        old = self._status[name]
        new = HostStatus(
            host=name, state=state, source=source or old.source,
            snapshot=old.snapshot if snapshot is _KEEP else snapshot,
            error=error, since=old.since if state == old.state else self.clock(),
            note=old.note if note is _KEEP else note, retry_at=retry_at,
            taken=old.taken if taken is _KEEP else taken, mine=old.mine if mine is _KEEP else mine,
        )
        if new == old:
            return
        self._status[name] = new
        self.version += 1
        if new.snapshot is not None and new.snapshot is not old.snapshot and name in self._histories \
                and not new.snapshot.stale:
            self._histories[name].add(new.snapshot)
        # A host that is stale before its first reading has not answered yet (its driver may be
        # slow to start): a one-shot command waits for it, up to its timeout (settle()).
        answered = state in SETTLED and not (state == "stale" and new.snapshot is None)
        if answered and name not in self._first:
            self._answered(name, new)
        for listener in list(self._listeners):
            try:
                listener(new)
            except Exception:  # one broken view must not stop the others
                log.exception("fleet listener failed")

    # -- running --

    async def _guarded(self, source: Source) -> None:
        try:
            await source.run(self)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in one source: its hosts say so, the others go on
            log.exception("fleet source %s failed", source.kind)
            why = f"internal error: {type(exc).__name__}: {exc}"
            for name in list(source.hosts):
                self.report(name, "error", error=why)
            if source.finds_hosts:
                self.source_read(source, why)

    async def run(self) -> None:
        """Run every source until stop(); then end them (remote streams are closed)."""
        if not self.sources:
            return
        tasks = [asyncio.create_task(self._guarded(s), name=f"fleet-{s.kind}") for s in self.sources]
        try:
            await self._stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        """End run() (call on the loop; from another thread use loop.call_soon_threadsafe)."""
        self._stop.set()

    async def settle(self, timeout: float) -> None:
        """Wait until every host has answered once (or failed), and every source that finds its
        hosts has read once, at most `timeout` seconds."""
        if self._unsettled or self._unread:
            try:
                async with asyncio.timeout(timeout):
                    await self._settled.wait()
            except TimeoutError:
                why = f"timeout (no answer in {timeout:g} s)"
                for name in list(self._unsettled):
                    if self._status[name].state == "stale":  # in, but silent: it stays so
                        self._answered(name, self._status[name])
                    else:
                        self.report(name, "unreachable", error=why)
                for source in self.sources:
                    if id(source) in self._unread:
                        self.source_read(source, why)
