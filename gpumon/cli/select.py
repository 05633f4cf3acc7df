"""`gpumon select`: a CUDA_VISIBLE_DEVICES value (UUIDs) for the best free cards (on an AMD
host ROCR_VISIBLE_DEVICES', on an Intel one ZE_AFFINITY_MASK').

`--export` prints shell commands instead, so `eval "$(gpumon select --export)"` pins the shell
itself: CUDA_VISIBLE_DEVICES by UUID and CUDA_DEVICE_ORDER=PCI_BUS_ID (or the AMD or Intel
variables: each vendor's record in gpumon/vendors.py), quoted for the shell (the UUIDs come from the driver). With no
free card nothing is printed on stdout (the reason goes to stderr, exit status 1), so the eval
does nothing.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

from gpumon.cards.sampler import read_topology, sample_once
from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.errors import EXIT_ALERT, EXIT_OK, UsageError
from gpumon.jobs.claims_and_queue import LaunchSharing
from gpumon.jobs.pinning import named_cards, vendor_env
from gpumon.jobs.placement import TooFewFree, choose


def run(args: argparse.Namespace) -> int:
    if args.shell and not args.export:
        raise UsageError("--shell goes with --export: eval \"$(gpumon select --export --shell fish)\"")
    if args.export and fleet_requested(args):
        raise UsageError("--export pins this shell to this machine's cards; with --hosts, select prints "
                         "HOST and UUIDs (use them with gpumon run --host)")
    if fleet_requested(args):
        from gpumon.cli.fleet_commands import select_hosts

        return select_hosts(args)
    settings = load_settings(args)
    deadline = time.monotonic() + args.timeout
    backend = open_source(args, settings.health, timeout=args.timeout)
    try:
        # A card that does not answer in time is "not responding", never waited for past --timeout.
        snapshot = sample_once(backend, max(0.0, deadline - time.monotonic()), settings.host_paths)
        topo = read_topology(backend, max(0.0, deadline - time.monotonic())) if args.count > 1 else None
    finally:
        backend.close()
    taken = LaunchSharing(settings.sharing, lambda line: print(f"gpumon: {line}", file=sys.stderr)).taken_now()
    try:
        choice = choose(snapshot, args.count, topo, min_free=args.min_free, max_util=args.max_util,
                        max_used=args.max_used, taken=taken.skip, preferred=taken.mine)
    except TooFewFree as exc:
        if args.verbose:
            _explain(exc.reasons)
        print(f"gpumon: {exc}", file=sys.stderr)
        return EXIT_ALERT  # like grep: ran fine, found nothing
    if args.verbose:
        _explain(choice.reasons)
    env, unset = vendor_env(list(choice.gpus))
    print(exports(env, args.shell, unset) if args.export else named_cards(env))
    return EXIT_OK


def exports(variables: dict[str, str], shell: str | None, unset: tuple[str, ...] = ()) -> str:
    """Commands that set `variables` (and remove `unset`) in the caller's shell, each value quoted
    for that shell."""
    if shell == "fish":
        return "\n".join([f"set -e {name};" for name in unset]
                         + [f"set -gx {name} {fish_quote(value)};" for name, value in variables.items()])
    return "\n".join([f"unset {name};" for name in unset]
                     + [f"export {name}={shlex.quote(value)};" for name, value in variables.items()])


def fish_quote(text: str) -> str:
    """fish's single quotes: only backslash and the quote itself are special inside them."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _explain(reasons) -> None:
    for reason in reasons:
        print(f"gpumon: {reason}", file=sys.stderr)
