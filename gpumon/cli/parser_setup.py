"""The commands that set gpumon up rather than watch cards: doctor, completion, config."""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh", "fish", "tcsh")


def add_setup_commands(sub, add_config_option, parser_class) -> None:
    p = sub.add_parser("doctor", help="is this machine set up for gpumon? one line per check, with the fix",
                       description="Checks the driver library and NVML, other users' processes, cgroups, the "
                                   "config, the claims folder, ssh to each configured host, the exporter's port "
                                   "and Textual. Exit status: 0 all ok, 1 a warning, 2 a failure.")
    p.add_argument("--json", action="store_true", help="the checks as JSON")
    p.add_argument("--nvml-lib", default=argparse.SUPPRESS, metavar="PATH",
                   help="check this libnvidia-ml.so.1 (also $GPUMON_NVML_LIB)")
    add_config_option(p, suppress=True)
    p.set_defaults(subcommand="doctor")

    p = sub.add_parser("completion", help="print a shell completion script: bash, zsh, fish or tcsh",
                       description="Prints a static completion script made from gpumon's options. bash: "
                                   "gpumon completion bash > ~/.local/share/bash-completion/completions/gpumon; "
                                   "fish: gpumon completion fish > ~/.config/fish/completions/gpumon.fish.")
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh, fish or tcsh")
    p.set_defaults(subcommand="completion")

    p = sub.add_parser("config", help="show the settings in force and where each came from",
                       description="Reads /etc/gpumon/config.toml (when present; $GPUMON_SYSTEM_CONFIG for tests "
                                   "and packagers) and then the user's config; the user's wins per key.")
    p.add_argument("--show", action="store_true", help="print every setting with its file and line, or default")
    add_config_option(p, suppress=True)
    p.set_defaults(subcommand="config")
