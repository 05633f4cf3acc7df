"""`queue`, `reserve` and `release` with `--hosts`: the same command run by each host's own gpumon
(over ssh; `local` as a child), at once, each answer under its host's name. A host's claims,
queue and reservations are its own: nothing is shared across hosts."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
from collections.abc import Sequence

from gpumon.cli import fleet
from gpumon.cli.common import load_settings
from gpumon.errors import EXIT_ALERT, EXIT_OK, UsageError
from gpumon.jobs.host import HostError, host_at
from gpumon.sanitize import printable

AT_ONCE = 32


def on_each_host(args: argparse.Namespace, argv: Sequence[str]) -> list[tuple[str, str | None, str | None]]:
    """(host, its gpumon's stdout or None, why not or None) for every host listed, in order."""
    config = load_settings(args)
    if getattr(args, "prometheus_url", None):
        raise UsageError("--prometheus-url reads hosts through Prometheus: there is no way to reach them (--hosts)")
    hosts = fleet.host_list(args, config)
    transport = fleet.transport(args, config)
    reads_cards = hasattr(args, "demo")
    local = fleet.local_args(args) if reads_cards else []

    def ask(spec) -> tuple[str, str | None, str | None]:
        host = host_at(spec, None if spec.is_local else transport, local)
        try:
            return spec.name, host.call(list(argv)), None
        except HostError as exc:
            return spec.name, None, str(exc)

    with concurrent.futures.ThreadPoolExecutor(min(AT_ONCE, max(1, len(hosts)))) as pool:
        return list(pool.map(ask, hosts))


def print_lines(answers: list[tuple[str, str | None, str | None]]) -> int:
    """Each host's lines, `HOST: line`; a host that failed on stderr. Exit 1 when one did."""
    failed = False
    for host, out, error in answers:
        if error is not None:
            failed = True
            print(f"gpumon: {printable(error)}", file=sys.stderr)
            continue
        for line in (out or "").splitlines():
            print(f"{printable(host)}: {line}")
    return EXIT_ALERT if failed else EXIT_OK


def documents(answers: list[tuple[str, str | None, str | None]], key: str) -> dict:
    """{"schema": 1, "hosts": [{"host", "error", KEY: [...]}]} from each host's JSON answer."""
    hosts = []
    for host, out, error in answers:
        entries = []
        if error is None:
            try:
                entries = json.loads(out or "{}").get(key, [])
            except (ValueError, AttributeError):
                error = f"{host}: did not answer with JSON"
        hosts.append({"host": host, "error": error, key: entries})
    return {"schema": 1, "hosts": hosts}
