"""`gpumon topo [--json]`: the link matrix with CPU and NUMA affinity, like `nvidia-smi topo -m`;
cards that are lost or do not answer within --timeout are left out, and it says so."""

from __future__ import annotations

import argparse

from gpumon.cards.sampler import read_topology
from gpumon.cli.common import fleet_requested, load_settings, print_document, read_once
from gpumon.cli.tables import topology_text
from gpumon.errors import UsageError


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):
        raise UsageError("topo reads this machine only: run `ssh HOST gpumon topo` for another")
    return print_document(args, read_once(args, load_settings(args), read_topology), topology_text)
