"""`gpumon signal PID [--signal TERM|KILL|INT] [--started T]`: what `x`/`X` do to a process on
another host, run there over ssh. The same checks as the TUI makes locally: your own processes only
(root: any), and, with --started, only the process that started at that time (a pid the kernel
has since given to another process is never signalled). Without --started, system processes
(PID 1, kernel threads, another user's session leader) are refused: a typo must not end the machine."""

from __future__ import annotations

import argparse

import psutil

from gpumon.cli.common import load_settings
from gpumon.errors import EXIT_OK, UsageError
from gpumon.jobs.processes import ActionError, may_signal, send_signal, system_process


def run(args: argparse.Namespace) -> int:
    load_settings(args)
    try:
        uid = psutil.Process(args.pid).uids().real
    except psutil.NoSuchProcess:
        raise UsageError(f"process {args.pid} has already exited") from None
    except psutil.Error as exc:
        raise UsageError(f"cannot inspect process {args.pid}: {exc}") from None
    if not may_signal(uid):
        raise UsageError(f"process {args.pid} belongs to another user: gpumon signals only your own processes")
    if args.started is None and (why := system_process(args.pid)) is not None:
        raise UsageError(f"process {args.pid} not signalled: {why}; name it with its start time "
                         "(--started, as in the snapshot) to signal it all the same")
    try:
        print(send_signal(args.pid, args.started, args.signal))
    except ActionError as exc:
        raise UsageError(str(exc)) from None
    return EXIT_OK
