"""The host `local`: this machine's own backend (NVML, or --demo/--replay), without ssh."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from gpumon.cards.backends import Backend
from gpumon.cards.sampler import Sampler
from gpumon.cards.sampler import run_in_daemon_thread as in_daemon_thread  # a hung driver init blocks nothing
from gpumon.errors import GpumonError
from gpumon.fleet.fleet import Source
from gpumon.fleet.remote_claims import taken_from_remote
from gpumon.model import Snapshot
from gpumon.owners.reader import HostPaths
from gpumon.remote.hosts import LOCAL
from gpumon.sharing.folder import SharingSettings
from gpumon.sharing.view import SharingNow, annotate

RETRY_S = 30.0


class LocalSource(Source):
    kind = "local"
    hosts = (LOCAL,)

    def __init__(self, open_backend: Callable[[], Backend], interval: float, owners: HostPaths = HostPaths(),
                 sharing: SharingSettings | None = None) -> None:
        self.open_backend = open_backend
        self.interval = interval
        self.owners = owners  # where this host's records of who runs what are
        # This host's claims and reservations, read in a thread (as a remote gpumon's stream says them).
        self.sharing = SharingNow(sharing) if sharing is not None else None

    async def run(self, fleet) -> None:
        while True:
            try:
                backend = await in_daemon_thread(self.open_backend)
            except GpumonError as exc:  # no driver here: say so, and look again later
                fleet.report(LOCAL, "error", error=str(exc).split("\n")[0], source="local")
                await asyncio.sleep(RETRY_S)
                continue
            sampler = Sampler(backend, interval=self.interval, history_seconds=0, owners=self.owners)

            def publish(snapshot: Snapshot) -> None:
                taken, mine = self._taken(snapshot)
                fleet.report(LOCAL, "stale" if snapshot.stale else "live", snapshot=snapshot, source="local",
                             error="the driver is slow to answer" if snapshot.stale else None, taken=taken, mine=mine)

            sampler.subscribe(publish)
            # Stopped, not cancelled: the sampler ends its own loop (a cancel could be lost in it).
            running = asyncio.ensure_future(sampler.run())
            try:
                await asyncio.shield(running)
            finally:
                sampler.stop()
                await running
                backend.close()

    def _taken(self, snapshot: Snapshot) -> tuple[tuple[tuple[str, str], ...], frozenset[str]]:
        """Cards others claim or reserve here, and the user's reserved ones: in the words a remote
        host's stream gives them (fleet/remote_claims.py), so FREE counts alike everywhere."""
        if self.sharing is None:
            return (), frozenset()
        cards = self.sharing.current(snapshot).cards
        doc = annotate({"gpus": [{"uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
                                  "mig_devices": [m.uuid for m in g.mig_devices]} for g in snapshot.gpus]}, cards)
        return taken_from_remote(doc)
