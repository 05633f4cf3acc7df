"""What every command needs for many hosts: the host list, the ssh transport, the Prometheus
server, and one reading of every host (`snapshot`, `select`)."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable, Iterable

from gpumon.cli.common import backend_args, open_source
from gpumon.config import Config
from gpumon.errors import UsageError, answered_status
from gpumon.fleet import Fleet, open_fleet
from gpumon.fleet.prometheus.source import DEFAULT_INTERVAL_S, PrometheusSource, parse_url
from gpumon.jobs.host import local_args as host_local_args
from gpumon.model import FleetSnapshot, HostStatus
from gpumon.remote.hosts import HostSpec, parse_hosts, read_hostfile, resolve
from gpumon.remote.ssh import CONNECT_TIMEOUT_S, SshTransport
from gpumon.settings import Settings


def host_list(args: argparse.Namespace, config: Config, use_config: bool = False) -> list[HostSpec]:
    """--hosts and --hostfile together; with `use_config` (the TUI), the config's [fleet] hosts when
    neither is given. An empty list: this machine alone, as before."""
    hosts: list[HostSpec] = []
    if getattr(args, "hosts", None) is not None:
        hosts += parse_hosts(args.hosts, config.fleet_groups)
    if getattr(args, "hostfile", None) is not None:
        hosts += read_hostfile(args.hostfile, config.fleet_groups)
    if not hosts and use_config and config.fleet_hosts and not getattr(args, "prometheus_url", None):
        hosts = resolve(config.fleet_hosts, config.fleet_groups)
    return list({h.name: h for h in hosts}.values())


def prometheus_url(args: argparse.Namespace, config: Config, use_config: bool = False) -> str | None:
    """--prometheus-url; with `use_config` (the TUI), the config's [fleet] prometheus_url when the
    command line names no hosts at all."""
    url = getattr(args, "prometheus_url", None)
    named = getattr(args, "hosts", None) or getattr(args, "hostfile", None)
    if url is None and use_config and config.fleet_prometheus_url and not named:
        try:
            url = parse_url(config.fleet_prometheus_url)
        except UsageError as exc:
            raise UsageError(f"config {config.path}: [fleet] prometheus_url: {exc}") from None
    return url


def transport(args: argparse.Namespace, config: Config) -> SshTransport:
    command = getattr(args, "ssh", None) or os.environ.get("GPUMON_SSH") or config.fleet_ssh
    return SshTransport(command, getattr(args, "remote_gpumon", None) or config.fleet_remote)


def local_args(args: argparse.Namespace) -> list[str]:
    """How a gpumon started here for `local` reads the same cards as this one."""
    return host_local_args(backend_args(args))


def build(args: argparse.Namespace, settings: Settings, hosts: list[HostSpec], url: str | None = None) -> Fleet:
    """The fleet of `hosts` (over ssh, or `local`) and of the Prometheus server at `url` (default:
    --prometheus-url), which is read every 5 s unless --interval was given."""
    config = settings.config
    if getattr(args, "replay", None) or getattr(args, "record", None):
        raise UsageError("--replay and --record read or write one machine: not with --hosts")
    url = url or getattr(args, "prometheus_url", None)
    given = getattr(args, "interval_given", False)
    extra = [PrometheusSource(url, args.interval if given else DEFAULT_INTERVAL_S, user=config.fleet_prometheus_user,
                              password_file=config.fleet_prometheus_password_file,
                              health=settings.health)] if url else []
    # The fleet's own tick (watch's clock for `unreachable for …`): its ssh hosts', else Prometheus'.
    interval = args.interval if hosts or given or not url else DEFAULT_INTERVAL_S
    remote = any(not h.is_local for h in hosts)
    return open_fleet(hosts, transport(args, config) if remote else None, interval,
                      lambda: open_source(args, settings.health), local_args(args), extra, settings.host_paths,
                      settings.sharing)


def settle_timeout(interval: float) -> float:
    return CONNECT_TIMEOUT_S + max(5.0, 3 * interval)


def was_read(status: HostStatus) -> bool:
    """A host whose cards were read (live, or stale with the last reading)."""
    return status.state in ("live", "stale") and status.snapshot is not None


def read_status(statuses: Iterable[HostStatus]) -> int:
    """A fleet command's exit status: whether anything was read (docs/configuration.md, "Exit status")."""
    return answered_status([was_read(s) for s in statuses])




def collect(args: argparse.Namespace, settings: Settings, hosts: list[HostSpec],
            on_answer: Callable[[HostStatus], None] | None = None) -> FleetSnapshot:
    """One reading of every host: each one's first answer, or why there was none. `on_answer`
    hears each host's as it comes."""
    fleet = build(args, settings, hosts)
    if on_answer is not None:
        fleet.on_first_answer(on_answer)

    async def once() -> FleetSnapshot:
        runner = asyncio.create_task(fleet.run())
        try:
            await fleet.settle(settle_timeout(fleet.interval))
            return fleet.first_answers()
        finally:
            fleet.stop()
            await runner

    doc = asyncio.run(once())
    problems = fleet.problems()
    if problems:  # the Prometheus server could not be read, or knows no GPU: bad input
        raise UsageError("; ".join(problems))
    return doc
