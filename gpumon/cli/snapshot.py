"""`gpumon snapshot [--json]`: one sample of every card, within --timeout (cards that have not
answered by then are shown as not responding)."""

from __future__ import annotations

import argparse

from gpumon.cli.common import print_document, read_once
from gpumon.cli.tables import snapshot_text
from gpumon.monitor.sampler import sample_once


def run(args: argparse.Namespace) -> int:
    return print_document(args, read_once(args, lambda backend, left: sample_once(backend, wait_s=left)), snapshot_text)
