"""What every subcommand needs: the config file, the data source, and printing a document."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gpumon.config import Config, load_config
from gpumon.errors import EXIT_OK, NoDriverError, UsageError


def load_settings(args: argparse.Namespace) -> Config:
    """The config file (checked by every command), with its interval as the default; its [health]
    rules apply to every card's verdict in this process."""
    from gpumon.monitor import health

    config = load_config(getattr(args, "config", None))
    health.configure(config.health, f"config {config.path}" if config.path else "config")
    if not hasattr(args, "interval_given"):  # on the command line (a source may have another default)
        args.interval_given = getattr(args, "interval", None) is not None
    if getattr(args, "interval", "absent") is None:
        args.interval = config.interval or 1.0
    return config


def fleet_requested(args: argparse.Namespace) -> bool:
    """Did the command line name hosts (--hosts/--hostfile/--prometheus-url)? Then the command
    reads the fleet."""
    return bool(getattr(args, "hosts", None) or getattr(args, "hostfile", None)
                or getattr(args, "prometheus_url", None))


def backend_args(args: argparse.Namespace) -> dict[str, Any]:
    """How to open the same data source again: the TUI's and `run`'s jobs' supervisors use it."""
    demo = args.demo or args.scenario is not None
    return {"demo": (args.scenario or "default") if demo else None, "seed": args.seed,
            "nvml_lib": args.nvml_lib or os.environ.get("GPUMON_NVML_LIB")}


def open_source(args: argparse.Namespace, timeout: float | None = None):
    """The backend the options ask for: the demo, a recording, or the NVIDIA driver. With a
    `timeout`, a driver that does not even start within it is an error (exit status 3)."""
    from gpumon.monitor.backends import open_backend

    replay = getattr(args, "replay", None)
    opened = backend_args(args)
    if opened["demo"] is not None and replay is not None:
        raise UsageError("--demo and --replay cannot be used together")

    def open_it():
        return open_backend(demo=opened["demo"], replay=replay, nvml_lib=args.nvml_lib, seed=args.seed)

    if timeout is None:
        return open_it()
    # nvmlInit itself can hang on a sick machine: wait for it in a thread that may be abandoned.
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["backend"] = open_it()
        except BaseException as exc:  # noqa: BLE001 - raised again below, in the caller's thread
            outcome["error"] = exc

    opener = threading.Thread(target=target, name="gpumon-open", daemon=True)
    opener.start()
    opener.join(timeout)
    if opener.is_alive():
        raise NoDriverError(f"the NVIDIA driver did not answer within {timeout:g} s (--timeout)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["backend"]


def read_once(args: argparse.Namespace, read: Callable[[Any, float], Any]) -> Any:
    """Open the source, read(backend, seconds left of --timeout), close."""
    load_settings(args)
    deadline = time.monotonic() + args.timeout
    backend = open_source(args, timeout=args.timeout)
    try:
        return read(backend, max(0.0, deadline - time.monotonic()))
    finally:
        backend.close()


def print_document(args: argparse.Namespace, data: Any, as_text: Callable[[Any], str]) -> int:
    """The --json document, or the table for people."""
    if args.json:
        json.dump(data.to_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(as_text(data))
    return EXIT_OK
