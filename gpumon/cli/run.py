"""`gpumon run [OPTIONS] -- CMD [ARG...]`: launch a command pinned to cards."""

from __future__ import annotations

import argparse
import sys

from gpumon.cli.common import backend_args, fleet_requested, load_settings, open_source
from gpumon.errors import UsageError
from gpumon.jobs.launch import LaunchRequest, launch
from gpumon.jobs.logout import logout_note


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    request = LaunchRequest(
        command=command, gpu_spec=args.gpu, mem_limit=args.mem_limit, numa=not args.no_numa,
        foreground=args.foreground, name=args.name, wait=args.wait, min_free=args.min_free,
        max_util=args.max_util, cwd=args.cwd, systemd=args.systemd, failover=args.failover,
        wait_timeout=args.wait_timeout, as_typed=args.as_typed,
        # A command line typed in a run dialog arrives as `sh -c TYPED` (jobs/host.py): the
        # history keeps it as it was typed, as when the dialog launched it itself.
        typed=command[2] if len(command) == 3 and command[:2] == ["/bin/sh", "-c"] else None,
    )
    if args.json and request.foreground:
        raise UsageError("--json goes with a detached job: --foreground runs it in this terminal")
    if args.host is not None or fleet_requested(args):  # on another host, over ssh
        from gpumon.cli.fleet_commands import run_host

        return run_host(args, request)
    if args.wait_timeout is not None and not args.wait:
        raise UsageError("--wait-timeout goes with --wait")
    settings = load_settings(args)
    backend = open_source(args, settings.health)
    try:
        code = launch(request, backend, backend_args=backend_args(args), interval=args.interval, out=sys.stdout,
                      as_json=args.json, shared=settings.sharing, keep=settings.jobs_keep,
                      config_file=getattr(args, "config", None), owners=settings.host_paths)
    finally:
        backend.close()
    if not request.foreground and (note := logout_note(request.systemd)):
        print(f"gpumon: note: {note}", file=sys.stderr)
    return code
