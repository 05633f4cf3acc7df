"""`gpumon topo [--json]`: the link matrix with CPU and NUMA affinity, like `nvidia-smi topo -m`."""

from __future__ import annotations

import argparse

from gpumon.cli.common import fleet_requested, print_document, read_once
from gpumon.cli.tables import topology_text
from gpumon.errors import UsageError


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):
        raise UsageError("topo reads this machine only: run `ssh HOST gpumon topo` for another")
    return print_document(args, read_once(args, lambda backend: backend.topology()), topology_text)
