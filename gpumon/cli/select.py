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
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from gpumon.cards.sampler import read_topology, sample_once
from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.errors import EXIT_ALERT, EXIT_OK, UsageError
from gpumon.jobs.child_gpumon import child_argv
from gpumon.jobs.claims_and_queue import CardsTaken, LaunchSharing
from gpumon.jobs.pinning import named_cards, vendor_env
from gpumon.jobs.placement import Choice, TooFewFree, allocated_elsewhere, choose, outside_allocation


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
    sharing = LaunchSharing(settings.sharing, lambda line: print(f"gpumon: {line}", file=sys.stderr))

    outside = outside_allocation(snapshot, os.environ)  # inside a Slurm job or a container: its cards
    outside.update(allocated_elsewhere(snapshot, os.environ))  # on a Slurm node: not its other jobs' cards

    def best(taken: CardsTaken) -> Choice:
        return choose(snapshot, args.count, topo, min_free=args.min_free, max_util=args.max_util,
                      max_used=args.max_used, taken={**outside, **taken.skip}, preferred=taken.mine)

    holder = _holder(args)
    try:
        choice = best(sharing.taken_now()) if holder is None else _claim(sharing, best, *holder)
    except TooFewFree as exc:
        if args.verbose:
            _explain(exc.reasons)
        print(f"gpumon: {exc}", file=sys.stderr)
        return EXIT_ALERT  # like grep: ran fine, found nothing
    if args.verbose:
        _explain(choice.reasons)
        if holder is None:
            print("gpumon: nothing is claimed: another launch or shell may take these cards too "
                  "(--claim holds them while this shell lives)", file=sys.stderr)
    env, unset = vendor_env(list(choice.gpus))
    print(exports(env, args.shell, unset) if args.export else named_cards(env))
    return EXIT_OK


@dataclass
class ShellClaim:
    """What `select --claim` claims: the cards chosen, for a job named after the shell."""

    choice: Choice
    id: str
    name: str

    @property
    def gpus(self) -> list[str]:
        return [g.ref for g in self.choice.gpus if g.ref]


def _holder(args: argparse.Namespace) -> tuple[int, float] | None:
    """The process whose life a --claim lasts (pid, start time): --claim-for's, or --claim's shell
    (the process that ran gpumon: `$(…)` runs it from the shell itself)."""
    if not (args.claim or args.claim_for):
        return None
    if args.claim and args.claim_for:
        raise UsageError("--claim holds the cards for the shell; --claim-for PID for another process: not both")
    pid = args.claim_for or os.getppid()
    try:
        return pid, psutil.Process(pid).create_time()
    except psutil.Error:
        raise UsageError(f"--claim-for {pid}: no such process") from None


def _claim(sharing: LaunchSharing, best: Callable[[CardsTaken], Choice], pid: int, started: float) -> Choice:
    """The best cards, claimed (gpumon.jobs.claim_holder holds them until process `pid` ends)."""
    job = f"shell-{pid}"
    chosen, _, hold = sharing.claim_chosen(lambda taken: ShellClaim(best(taken), job, f"select --claim (pid {pid})"),
                                           auto=True)
    try:
        subprocess.Popen(child_argv("gpumon.jobs.claim_holder", [str(sharing.directory), job, str(pid), repr(started)]),
                         pass_fds=hold.fds, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError as exc:
        hold.release()
        raise UsageError(f"cannot hold the claims: {exc.strerror or exc}") from None
    hold.close()  # the holder has them now
    cards = ", ".join(f"GPU {g.index}" for g in chosen.choice.gpus)
    print(f"gpumon: {cards} claimed until process {pid} ends", file=sys.stderr)
    return chosen.choice


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
