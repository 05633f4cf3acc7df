"""`gpumon snapshot [--json]`: one sample of every card."""

from __future__ import annotations

import argparse

from gpumon.cli.common import print_document, read_once
from gpumon.cli.tables import snapshot_text
from gpumon.monitor.sampler import sample_once


def run(args: argparse.Namespace) -> int:
    return print_document(args, read_once(args, sample_once), snapshot_text)
