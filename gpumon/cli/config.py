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

# What a key is when no file sets it, where that is a value (the rest are simply unset).
DEFAULTS = {"interval": 1.0, "readonly": False, "watch.hook_timeout": 10.0, "watch.prometheus_processes": False,
            "serve.listen": "127.0.0.1:8080", "fleet.ssh": "ssh", "fleet.remote": "gpumon"}


def run(args: argparse.Namespace) -> int:
    if not args.show:
        raise UsageError("say what to do: gpumon config --show (see `gpumon config --help`)")
    config = load_settings(args).config
    tables = {file: tomllib.loads(text) for file, text in config.texts.items()}
    rows = []
    for section, schema in SCHEMA.items():
        for key in schema:
            name = f"{section}.{key}" if section else key
            if name in config.origins:
                file, line = config.origins[name]
                table = tables[file] if not section else tables[file].get(section, {})
                value, source = json.dumps(table[key]), f"{file}:{line}" if line else str(file)
            elif name in DEFAULTS:
                value, source = json.dumps(DEFAULTS[name]), "default"
            else:
                value, source = "(unset)", "default"
            rows.append((name, printable(value), printable(source)))
    width = max(len(name) + len(value) for name, value, _ in rows) + 3
    files = ", ".join(printable(str(f)) for f in config.texts) or f"none (no {system_path()}, no user config)"
    sys.stdout.write(f"# files read, later ones win per key: {files}\n")
    for name, value, source in rows:
        sys.stdout.write(f"{name} = {value}".ljust(width) + f"# {source}\n")
    return 0
