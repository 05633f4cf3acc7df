"""What every subcommand needs: the config file, the data source, and printing a document."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpumon.config import Config, load_config
from gpumon.errors import EXIT_OK, NoDriverError, UsageError

if TYPE_CHECKING:
    from gpumon.health.rules import HealthSettings
    from gpumon.settings import Settings


def load_settings(args: argparse.Namespace, config: Config | None = None) -> Settings:
    """The settings of this run, built once from the config files (checked by every command), the
    environment and the options; the config's interval becomes the default --interval. `config`:
    the file already read. Hand the settings (or the part needed) to what reads them."""
    from gpumon.alerting.config_rules import check_config_rules
    from gpumon.settings import settings_from

    if config is None:
        config = load_config(getattr(args, "config", None))
    check_config_rules(config)
    if not hasattr(args, "interval_given"):  # on the command line (a source may have another default)
        args.interval_given = getattr(args, "interval", None) is not None
    if getattr(args, "interval", "absent") is None:
        args.interval = config.interval or 1.0
    _, procfs = filesystem_roots(args, config)
    return settings_from(config, procfs)


def xid_state_file(config: Config):
    """Where `watch` keeps the XIDs it heard for `gpumon health`: [health] xid_state, else the state dir."""
    from pathlib import Path

    from gpumon.health.seen_xids import default_state_file

    given = config.health.get("xid_state")
    return Path(given).expanduser() if given else default_state_file()


def filesystem_roots(args: argparse.Namespace, config: Config | None = None) -> tuple[str | None, str | None]:
    """Where sysfs and procfs are: --path.sysfs/--path.procfs, else the config's [paths]; None for
    /sys and /proc. Resolved once into `args` (the TUI opens the driver before it checks the config)."""
    if not getattr(args, "roots_resolved", False):
        if config is None:
            config = load_config(getattr(args, "config", None))
        args.path_sysfs = getattr(args, "path_sysfs", None) or config.path_sysfs
        args.path_procfs = getattr(args, "path_procfs", None) or config.path_procfs
        args.roots_resolved = True
    return args.path_sysfs, args.path_procfs


def fleet_requested(args: argparse.Namespace) -> bool:
    """Did the command line name hosts (--hosts/--hostfile/--prometheus-url)? Then the command
    reads the fleet. (--local, this machine alone, names none.)"""
    # `--hosts ''` names hosts, badly: it is refused (host_list), never this machine instead.
    named = (getattr(args, "hosts", None) is not None or getattr(args, "hostfile", None) is not None
             or bool(getattr(args, "prometheus_url", None)))
    if named and getattr(args, "local", False):
        raise UsageError("--local reads this machine alone: not with --hosts, --hostfile or --prometheus-url")
    return named


def backend_args(args: argparse.Namespace) -> dict[str, Any]:
    """How to open the same data source again: the TUI's and `run`'s jobs' supervisors use it."""
    demo = args.demo or args.scenario is not None
    sysfs, procfs = filesystem_roots(args)
    return {"demo": (args.scenario or "default") if demo else None, "seed": args.seed,
            "nvml_lib": args.nvml_lib or os.environ.get("GPUMON_NVML_LIB"), "sysfs": sysfs, "procfs": procfs}


def open_source(args: argparse.Namespace, health: HealthSettings, timeout: float | None = None):
    """The backend the options ask for: the demo, a recording, or the NVIDIA driver, its verdicts
    drawn by `health` (the settings'). With a `timeout`, a driver that does not even start within
    it is an error (exit status 3)."""
    from gpumon.cards.backends import open_backend

    replay = getattr(args, "replay", None)
    opened = backend_args(args)
    if opened["demo"] is not None and replay is not None:
        raise UsageError("--demo and --replay cannot be used together")

    def open_it():
        return open_backend(demo=opened["demo"], replay=replay, nvml_lib=args.nvml_lib, seed=args.seed,
                            sysfs=opened["sysfs"], procfs=opened["procfs"], health=health)

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


def read_once(args: argparse.Namespace, settings: Settings, read: Callable[[Any, float], Any]) -> Any:
    """Open the source, read(backend, seconds left of --timeout), close."""
    deadline = time.monotonic() + args.timeout
    backend = open_source(args, settings.health, timeout=args.timeout)
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
