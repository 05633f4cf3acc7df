"""Many hosts: reading every GPU host the user can reach, over their own ssh, or through the
cluster's Prometheus server.

`stream` keeps one gpumon stream per host over remote/ssh (`nvidia_smi` when gpumon is not
installed there), `local` reads this machine, `schema` checks everything a host sends,
`prometheus/` reads every host a Prometheus server has GPU series of, and `fleet.Fleet` holds
every host's latest status for the views. Talking to a host is remote/'s; acting on one is
jobs/host.py's. See docs/design.md, "Many hosts".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpumon.cards.backends import Backend
from gpumon.fleet.fleet import Fleet, Source
from gpumon.fleet.local import LocalSource
from gpumon.fleet.prometheus.source import PrometheusSource
from gpumon.fleet.stream import SshSource
from gpumon.owners.reader import HostPaths
from gpumon.remote.hosts import HostSpec
from gpumon.remote.ssh import SshTransport
from gpumon.sharing.folder import SharingSettings


def open_fleet(hosts: Sequence[HostSpec], transport: SshTransport | None, interval: float,
               open_local: Callable[[], Backend] | None = None, local_args: Sequence[str] = (),
               extra_sources: Sequence[Source] = (), owners: HostPaths = HostPaths(),
               sharing: SharingSettings | None = None) -> Fleet:
    """A Fleet reading `hosts`: `local` through `open_local()` (its processes' owners read where
    `owners` says, its claims and reservations where `sharing` says), the others through ssh; and the
    hosts `extra_sources` find (a PrometheusSource)."""
    sources: list[Source] = []
    for spec in hosts:
        if spec.is_local:
            if open_local is None:
                raise ValueError("the host list names `local` but no local backend was given")
            sources.append(LocalSource(open_local, interval, owners, sharing))
        else:
            if transport is None:
                raise ValueError("remote hosts need an SshTransport")
            sources.append(SshSource(spec, transport, interval))
    return Fleet(hosts, [*sources, *extra_sources], interval, transport, local_args)


__all__ = ["Fleet", "LocalSource", "PrometheusSource", "Source", "SshSource", "open_fleet"]
