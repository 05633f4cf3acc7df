"""Many hosts: reading every GPU host the user can reach, over their own ssh, or through the
cluster's Prometheus server.

`hosts` parses host lists, `ssh` builds and runs the OpenSSH command lines, `stream` keeps one
gpumon stream per host (`nvidia_smi` when gpumon is not installed there), `local` reads this
machine, `schema` checks everything a host sends (acting on a host is jobs/host.py's),
`prometheus` reads every host a Prometheus server has GPU series of (`dcgm` maps dcgm-exporter's
names and labels), and `fleet.Fleet` holds every host's latest status for the views. See
docs/design.md, "Many hosts".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gpumon.monitor.backends import Backend
from gpumon.monitor.fleet.fleet import Fleet, Source
from gpumon.monitor.fleet.hosts import LOCAL, HostSpec, parse_hosts, read_hostfile
from gpumon.monitor.fleet.local import LocalSource
from gpumon.monitor.fleet.prometheus import PrometheusSource
from gpumon.monitor.fleet.ssh import SshTransport
from gpumon.monitor.fleet.stream import SshSource


def open_fleet(hosts: Sequence[HostSpec], transport: SshTransport | None, interval: float,
               open_local: Callable[[], Backend] | None = None, local_args: Sequence[str] = (),
               extra_sources: Sequence[Source] = ()) -> Fleet:
    """A Fleet reading `hosts`: `local` through `open_local()`, the others through ssh; and the
    hosts `extra_sources` find (a PrometheusSource)."""
    sources: list[Source] = []
    for spec in hosts:
        if spec.is_local:
            if open_local is None:
                raise ValueError("the host list names `local` but no local backend was given")
            sources.append(LocalSource(open_local, interval))
        else:
            if transport is None:
                raise ValueError("remote hosts need an SshTransport")
            sources.append(SshSource(spec, transport, interval))
    return Fleet(hosts, [*sources, *extra_sources], interval, transport, local_args)


__all__ = ["LOCAL", "Fleet", "HostSpec", "LocalSource", "PrometheusSource", "Source",
           "SshSource",
           "SshTransport", "open_fleet", "parse_hosts", "read_hostfile"]
