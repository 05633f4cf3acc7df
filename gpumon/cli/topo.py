"""`gpumon topo [--json]`: the link matrix with CPU and NUMA affinity, like `nvidia-smi topo -m`."""

from __future__ import annotations

import argparse

from gpumon.cli.common import print_document, read_once
from gpumon.cli.tables import topology_text


def run(args: argparse.Namespace) -> int:
    return print_document(args, read_once(args, lambda backend: backend.topology()), topology_text)
