"""`gpumon config --show`: every setting in force and where it came from: the system file
(/etc/gpumon/config.toml), the user's, or the default."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib

from gpumon.cli.common import load_settings
from gpumon.config import SCHEMA, system_path
from gpumon.errors import UsageError
from gpumon.sanitize import printable


def _duration(seconds: float) -> str:
    """A default span as the docs write it: "30d", "10m", "30s"."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def defaults() -> dict[str, object]:
    """What a key is when no file sets it, from the constants the code uses (the rest: unset)."""
    from gpumon.config import DEFAULT_THEME, JOBS_KEEP, JOBS_KEEP_FOR_S
    from gpumon.health.rules import DEFAULT_INTERVAL_S, DEFAULT_WINDOW_S
    from gpumon.owners.reader import HostPaths
    from gpumon.sharing.folder import IDLE_RELEASE_S, where
    from gpumon.usage.settings import DEFAULT_KEEP_S, default_path

    paths = HostPaths()
    return {
        "interval": 1.0, "theme": DEFAULT_THEME, "readonly": False, "watch.hook_timeout": 10.0,
        "watch.prometheus_processes": False, "fleet.ssh": "ssh", "fleet.remote": "gpumon",
        "owners.pods_dir": str(paths.pods_dir), "owners.docker_dir": str(paths.docker_dir),
        "owners.podman_dir": str(paths.podman_dir), "owners.nerdctl_dir": str(paths.nerdctl_dir),
        "paths.sysfs": "/sys", "paths.procfs": str(paths.procfs),
        "health.window": _duration(DEFAULT_WINDOW_S), "health.interval": _duration(DEFAULT_INTERVAL_S),
        "serve.listen": "127.0.0.1:8080", "claims.dir": str(where(None, {})),
        "claims.idle_release": _duration(IDLE_RELEASE_S),
        "history.path": str(default_path()), "history.keep": _duration(DEFAULT_KEEP_S), "history.record": True,
        "jobs.keep": JOBS_KEEP, "jobs.keep_for": _duration(JOBS_KEEP_FOR_S),
    }


def run(args: argparse.Namespace) -> int:
    if not args.show:
        raise UsageError("say what to do: gpumon config --show (see `gpumon config --help`)")
    config = load_settings(args).config
    tables = {file: tomllib.loads(text) for file, text in config.texts.items()}
    rows = []
    default = defaults()
    for section, schema in SCHEMA.items():
        for key in schema:
            name = f"{section}.{key}" if section else key
            if name in config.origins:
                file, line = config.origins[name]
                table = tables[file] if not section else tables[file].get(section, {})
                value, source = json.dumps(table[key]), f"{file}:{line}" if line else str(file)
            elif name in default:
                value, source = json.dumps(default[name]), "default"
            else:
                value, source = "(unset)", "default"
            rows.append((name, printable(value), printable(source)))
    width = max(len(f"{name} = {value}") for name, value, _ in rows) + 2  # two spaces before every comment
    files = ", ".join(printable(str(f)) for f in config.texts) or f"none (no {system_path()}, no user config)"
    sys.stdout.write(f"# files read, later ones win per key: {files}\n")
    for name, value, source in rows:
        sys.stdout.write(f"{name} = {value}".ljust(width) + f"# {source}\n")
    return 0
