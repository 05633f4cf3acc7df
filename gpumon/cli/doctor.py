"""`gpumon doctor [--json]`: is this machine set up for gpumon? One line per check: its id, ok, warn or
fail, what was found and the fix. Exit status 0 all ok, 1 a warning, 2 a failure."""

from __future__ import annotations

import argparse
import json
import sys

from gpumon.doctor.check import exit_status
from gpumon.doctor.report import all_checks
from gpumon.sanitize import printable


def run(args: argparse.Namespace) -> int:
    checks = all_checks(getattr(args, "config", None), getattr(args, "nvml_lib", None))
    if args.json:
        json.dump({"checks": [c.to_dict() for c in checks], "status": exit_status(checks)}, sys.stdout)
        sys.stdout.write("\n")
    else:
        width = max(len(c.id) for c in checks)
        for c in checks:
            fix = f" -- fix: {c.fix}" if c.fix and c.status != "ok" else ""
            sys.stdout.write(f"{c.status:<4}  {c.id:<{width}}  {printable(c.summary)}{printable(fix)}\n")
    return exit_status(checks)
