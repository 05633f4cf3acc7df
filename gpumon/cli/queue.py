"""`gpumon queue [--json]`: the host's queue of jobs waiting for cards (`run --wait`), every
user's, next to start first (gpumon/sharing/queue.py)."""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time

from gpumon.cli.common import fleet_requested, load_settings
from gpumon.errors import EXIT_OK
from gpumon.sanitize import printable
from gpumon.sharing import queue
from gpumon.sharing.folder import SharingSettings
from gpumon.units import format_time


def queue_document(sharing: SharingSettings) -> dict:
    """`{"schema": 1, "host", "time", "queue": [entry]}`, entries next to start first."""
    directory = sharing.directory
    entries = queue.read(directory) if directory.is_dir() else []
    return {"schema": 1, "host": socket.gethostname(), "time": time.time(), "queue": [e.to_dict() for e in entries]}


def queue_text(document: dict) -> str:
    if not document["queue"]:
        return "no jobs are waiting for cards on this host\n"
    rows = [("POS", "USER", "JOB", "NAME", "WANTS", "QUEUED", "WHY IT WAITS")]
    for e in document["queue"]:
        rows.append((str(e["position"]), printable(e["user"]), printable(e["job"]), printable(e["name"]),
                     printable(e["gpu_spec"]), format_time(e["queued"], seconds=True), printable(e.get("reason", ""))))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() + "\n" for row in rows)


def run(args: argparse.Namespace) -> int:
    if fleet_requested(args):  # each host's own queue, each as it answers
        from gpumon.cli.sharing_hosts import as_they_answer, documents, on_each_host, print_as_they_answer

        if not args.json:
            return print_as_they_answer(as_they_answer(args, ["queue"]))
        doc, status = documents(on_each_host(args, ["queue", "--json"]), "queue")
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return status
    document = queue_document(load_settings(args).sharing)
    if args.json:
        json.dump(document, sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(queue_text(document))
    return EXIT_OK
