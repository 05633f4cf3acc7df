"""`gpumon jobs`: list, stop and prune the jobs gpumon launched."""

from __future__ import annotations

import argparse
import json
import sys

from gpumon.cli.common import fleet_requested, load_settings
from gpumon.cli.tables import jobs_text
from gpumon.errors import EXIT_OK, UsageError
from gpumon.jobs import control, records


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):
        from gpumon.cli.fleet_commands import jobs_hosts

        return jobs_hosts(args)
    load_settings(args)
    if args.follow and not args.log:
        raise UsageError("--follow goes with --log ID")
    if args.log:
        from gpumon.jobs.logs import print_log

        return print_log(records.find_job(args.log), sys.stdout.buffer, follow=args.follow)
    if args.prune:
        removed = records.prune()
        for job in removed:
            print(f"removed {job.spec.id}  {job.spec.name}  {job.state}")
        print(f"removed {len(removed)} finished job{'s' if len(removed) != 1 else ''}")
        return EXIT_OK
    if args.stop:
        print(control.stop(records.find_job(args.stop)))
        return EXIT_OK
    listed = records.list_jobs()
    if args.json:
        json.dump([job.to_dict() for job in listed], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(jobs_text(listed))
    return EXIT_OK
