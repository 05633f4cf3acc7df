"""ssh to each host the config names ([fleet] hosts and groups), in parallel and in bounded time, and
the gpumon version each runs."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

from gpumon import __version__
from gpumon.config import Config
from gpumon.doctor.check import FAIL, OK, WARN, Check
from gpumon.errors import UsageError
from gpumon.remote.hosts import HostSpec, resolve
from gpumon.remote.ssh import SshTransport, describe_failure
from gpumon.sanitize import printable

CONNECT_S = 5
MAX_PARALLEL = 32


def configured_hosts(config: Config) -> list[HostSpec]:
    entries = list(config.fleet_hosts) + [f"@{name}" for name in config.fleet_groups]
    seen: dict[str, HostSpec] = {}
    for host in resolve(entries, config.fleet_groups):
        if not host.is_local:
            seen.setdefault(host.name, host)
    return list(seen.values())


def host_checks(config: Config, timeout: float = CONNECT_S * 2) -> list[Check]:
    try:
        hosts = configured_hosts(config)
        if not hosts:
            return []
        transport = SshTransport(config.fleet_ssh, config.fleet_remote, connect_timeout=CONNECT_S, sharing=False)
    except UsageError as exc:
        return [Check("ssh", FAIL, str(exc), "fix [fleet] in the config")]
    with ThreadPoolExecutor(min(MAX_PARALLEL, len(hosts))) as pool:
        return list(pool.map(lambda h: _one(transport, h, timeout), hosts))


def _one(transport: SshTransport, host: HostSpec, timeout: float) -> Check:
    name = f"ssh.{host.name}"
    argv = transport.gpumon_argv(host, ["--version"])
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                              errors="replace")
    except subprocess.TimeoutExpired:
        return Check(name, FAIL, f"{host.name}: no answer within {timeout:g} s", "is the host up? try `ssh HOST`")
    except OSError as exc:
        return Check(name, FAIL, f"{host.name}: cannot run ssh: {exc.strerror}", "install OpenSSH's client")
    if done.returncode != 0:
        return Check(name, FAIL, f"{host.name}: {describe_failure(done.returncode, done.stderr)}",
                     "check `ssh HOST gpumon --version` by hand; [fleet] ssh and remote set how gpumon gets there")
    there = printable(done.stdout.strip().removeprefix("gpumon ").strip())[:40]
    if there != __version__:
        return Check(name, WARN, f"{host.name}: gpumon {there} there, {__version__} here",
                     "install the same gpumon version on every host")
    return Check(name, OK, f"{host.name}: reached, gpumon {there}")
