"""`queue`, `reserve` and `release` with `--hosts`: the same command run by each host's own gpumon
(over ssh; `local` as a child), at once, each answer under its host's name as it comes (a slow
host holds up no other). A host's claims, queue and reservations are its own: nothing is shared
across hosts. Exit status as every fleet command's: 0 every host answered, 4 some did not, 5 none."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

from gpumon.cli import fleet
from gpumon.cli.common import load_settings
from gpumon.errors import UsageError
from gpumon.jobs.host import HostError, host_at
from gpumon.remote.children import end_all
from gpumon.sanitize import printable

AT_ONCE = 32
Answer = tuple[str, "str | None", "str | None"]  # (host, its gpumon's stdout or None, why not or None)


def as_they_answer(args: argparse.Namespace, argv: Sequence[str]) -> Iterator[Answer]:
    """Every host listed, each as soon as it has answered (or failed)."""
    config = load_settings(args).config
    if getattr(args, "prometheus_url", None):
        raise UsageError("--prometheus-url reads hosts through Prometheus: there is no way to reach them (--hosts)")
    hosts = fleet.host_list(args, config)
    transport = fleet.transport(args, config)
    reads_cards = hasattr(args, "demo")
    local = fleet.local_args(args) if reads_cards else []

    def ask(spec) -> Answer:
        host = host_at(spec, None if spec.is_local else transport, local)
        try:
            return spec.name, host.call(list(argv)), None
        except HostError as exc:
            return spec.name, None, str(exc)

    pool = ThreadPoolExecutor(min(AT_ONCE, max(1, len(hosts))))
    try:
        for future in as_completed([pool.submit(ask, spec) for spec in hosts]):
            yield future.result()
    except BaseException:  # Ctrl-C: no host still asked holds up the exit
        end_all()
        raise
    finally:
        pool.shutdown(cancel_futures=True)


def on_each_host(args: argparse.Namespace, argv: Sequence[str]) -> list[Answer]:
    """Every host's answer, in the order listed (for one document)."""
    config = load_settings(args).config
    order = {spec.name: i for i, spec in enumerate(fleet.host_list(args, config))}
    return sorted(as_they_answer(args, argv), key=lambda answer: order[answer[0]])


def print_as_they_answer(answers: Iterator[Answer]) -> int:
    """Each host's lines as it answers, `HOST: line` (made printable: they come from the host); a
    host that failed, on stderr. The fleet's exit status (0, 4, 5)."""
    answered = []
    for host, out, error in answers:
        answered.append(error is None)
        if error is not None:
            print(f"gpumon: {printable(error)}", file=sys.stderr, flush=True)
            continue
        sys.stdout.write("".join(f"{printable(host)}: {printable(line)}\n" for line in (out or "").splitlines()))
        sys.stdout.flush()
    return fleet.answered_status(answered)


def documents(answers: list[Answer], key: str) -> tuple[dict, int]:
    """({"schema": 1, "hosts": [{"host", "error", KEY: [...]}]} from each host's JSON answer, the
    fleet's exit status)."""
    hosts = []
    for host, out, error in answers:
        entries = []
        if error is None:
            try:
                entries = json.loads(out or "{}").get(key, [])
            except (ValueError, AttributeError):
                error = f"{host}: did not answer with JSON"
        hosts.append({"host": host, "error": error, key: entries})
    return {"schema": 1, "hosts": hosts}, fleet.answered_status(h["error"] is None for h in hosts)
