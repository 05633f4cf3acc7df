"""One sampler (or one fleet) however many pages are open.

The cards are read once per interval, whatever the number of viewers: `Feed` keeps the latest
view, encoded once as a Server-Sent Event, and every open page's stream waits on it. A page that
reads slowly skips to the newest view rather than queueing old ones. `LocalCards` feeds it from
this machine's `Sampler`, `FleetCards` from a `Fleet`; both keep the documents of /api/snapshot,
/api/health and /api/users for the latest reading, made at most once per reading however many ask.

Who holds the cards comes from one HolderTracker fed every reading from the server's start (a fleet's
host by host, as each reports), so idle time counts from then, whoever opens the page when.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumon.cards.sampler import Sampler, card_wait
from gpumon.cards.xid_events import XidListener
from gpumon.fleet import Fleet
from gpumon.health.verdicts import fleet_health_document, health_document
from gpumon.model import FleetSnapshot, HostStatus, Snapshot
from gpumon.owners.holders import Holder, HolderTracker, users_document
from gpumon.sharing import view
from gpumon.sharing.folder import SharingSettings
from gpumon.web.view import fleet_view, local_view


class Feed:
    """The latest view as an event, and the streams waiting for the next one."""

    def __init__(self) -> None:
        self.version = 0
        self.message: bytes | None = None
        self.closed = False
        self._next = asyncio.Event()

    def publish(self, view: dict[str, Any]) -> None:
        self.message = b"data: " + json.dumps(view, separators=(",", ":")).encode() + b"\n\n"
        self.version += 1
        arrived, self._next = self._next, asyncio.Event()
        arrived.set()

    async def wait(self, seen: int, timeout: float) -> tuple[int, bytes | None]:
        """(version, event) newer than `seen`; (seen, None) after `timeout` without one, or once closed."""
        if self.version == seen and not self.closed:
            try:
                async with asyncio.timeout(timeout):
                    await self._next.wait()
            except TimeoutError:
                return seen, None
        if self.closed:
            return seen, None
        return self.version, self.message

    def close(self) -> None:
        """Every stream ends (the server is stopping)."""
        self.closed = True
        self._next.set()


class _Cached:
    """A document of the latest reading, made when first asked for."""

    def __init__(self, make: Callable[[Any], dict[str, Any]]) -> None:
        self.make = make
        self._of: Any = None
        self._doc: dict[str, Any] | None = None

    def of(self, reading: Any) -> dict[str, Any] | None:
        if reading is None:
            return None
        if reading is not self._of:
            self._of, self._doc = reading, self.make(reading)
        return self._doc


class _Documents:
    """The /api documents of the latest reading: each made once per reading however many ask."""

    latest: Any
    _snapshot: _Cached
    _health: _Cached
    _users: _Cached

    def snapshot_document(self) -> dict[str, Any] | None:
        return self._snapshot.of(self.latest)

    def health_document(self) -> dict[str, Any] | None:
        return self._health.of(self.latest)

    def users_document(self) -> dict[str, Any] | None:
        return self._users.of(self.latest)


class LocalCards(_Documents):
    """This machine's cards, from one Sampler."""

    fleet = False

    def __init__(self, sampler: Sampler, feed: Feed, sharing: SharingSettings | None = None) -> None:
        """`sharing`: where this host's claims, reservations and queue are ([claims]; None: the defaults)."""
        sharing = sharing or SharingSettings()
        self.sampler = sampler
        self.feed = feed
        self.sharing = sharing
        self.latest: Snapshot | None = None
        self.holders = HolderTracker()
        self.holding: tuple[Holder, ...] = ()
        self._first: float | None = None  # the first reading's time: how long the server has watched
        # As `gpumon snapshot --json`: each card with its claims and reservation (gpumon/sharing).
        self.shared = view.SharingNow(sharing)  # read in a thread, every 2 s at most: the place is everyone's
        self._snapshot = _Cached(lambda s: view.annotate(s.to_dict(), self.shared.current(s).cards))
        self._health = _Cached(health_document)
        # As `gpumon users --json`, with this host's reservations (gpumon/sharing).
        self._users = _Cached(lambda s: {**users_document(self.holding, s.time, s.time - (self._first or s.time)),
                                         "reservations": [r.to_dict() for r in self.shared.reservations().values()],
                                         "without_claim": [{**u.to_dict(), "words": u.words()}
                                                           for u in self.shared.without_claim(s)]})
        self._xids: XidListener | None = None
        sampler.subscribe(self._on_snapshot)

    def _on_snapshot(self, snapshot: Snapshot) -> None:
        self.holding = self.holders.update(snapshot)
        if self._first is None:
            self._first = snapshot.time
        self.latest = snapshot
        # This host's claims, reservations and queue, as last read (sharing/view.SharingNow).
        shared = self.shared.current(snapshot)
        self.feed.publish(local_view(snapshot, self.sampler.interval, self.holding, shared))

    async def run(self) -> None:
        backend = await self.sampler.open()
        # XIDs come as events: the backend counts each one it hands out in its card's verdict.
        if XidListener.available(backend):
            self._xids = XidListener(backend, lambda *_: None)
            self._xids.start(asyncio.get_running_loop())
        try:
            await self.sampler.run()
        finally:
            await asyncio.to_thread(_let_passes_end, card_wait(self.sampler.interval) + 1.0)

    def stop(self) -> None:
        self.sampler.stop()
        if self._xids is not None:
            self._xids.stop()


def _let_passes_end(timeout: float) -> None:
    """A pass still reading the cards when sampling stops may end first (bounded): the backend is
    closed next, and a pass cut off by the driver's shutdown would say that the driver is gone."""
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name == "gpumon-sample":
            thread.join(max(0.0, deadline - time.monotonic()))


class FleetCards(_Documents):
    """Every host's cards, from one Fleet: a view at most every `COALESCE_S` however many hosts report,
    and at least every interval."""

    fleet = True
    COALESCE_S = 0.2

    def __init__(self, fleet: Fleet, feed: Feed) -> None:
        self.runner = fleet
        self.feed = feed
        self.latest: FleetSnapshot | None = None
        self._pending = False
        # Each host's holders as of its latest reading, fed as hosts report (O(1) hosts a report).
        self.holders = HolderTracker()
        self.holding: dict[str, tuple[Holder, ...]] = {}
        self._first: float | None = None  # the first host's first reading: how long the server has watched
        self._snapshot = _Cached(lambda d: d.to_dict())
        self._health = _Cached(fleet_health_document)
        self.latest_holders: tuple[Holder, ...] = ()  # of `latest`'s hosts, as it was built
        self._users = _Cached(lambda d: users_document(self.latest_holders, d.time, d.time - (self._first or d.time),
                                                       d.hosts))
        fleet.subscribe(self._on_host)

    def _on_host(self, status: HostStatus) -> None:
        if status.snapshot is not None and status.state in ("live", "stale"):
            self.holding[status.host] = self.holders.update(status.snapshot, status.host)
            if self._first is None:
                self._first = status.snapshot.time
        else:  # away: who held its cards is no longer known
            self.holding.pop(status.host, None)
        if not self._pending:
            self._pending = True
            asyncio.get_running_loop().call_later(min(self.COALESCE_S, self.runner.interval / 4), self._build)

    def _build(self) -> None:
        self._pending = False
        latest = self.runner.document()
        self.latest_holders = tuple(h for status in latest.hosts for h in self.holding.get(status.host, ()))
        self.latest = latest
        self.feed.publish(fleet_view(latest, self.runner.interval, self.runner.problems(), self.latest_holders))

    async def run(self) -> None:
        self._build()  # the hosts, connecting, before any has answered
        ticker = asyncio.create_task(self._tick())
        try:
            await self.runner.run()
        finally:
            ticker.cancel()

    async def _tick(self) -> None:
        """A view every interval even when no host changed (all away): the page sees it is live."""
        while True:
            seen = self.feed.version
            await asyncio.sleep(max(self.runner.interval, 1.0))
            if self.feed.version == seen and not self._pending:
                self._build()

    def stop(self) -> None:
        self.runner.stop()
