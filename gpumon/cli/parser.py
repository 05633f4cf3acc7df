"""The command line's grammar: every subcommand, its options, and the types that check them.

Each subcommand is a module of gpumon.cli with a `run(args) -> int`; the parser only names it
(`args.subcommand`), so `gpumon snapshot` never imports the TUI and `gpumon --version` imports nothing.
"""

from __future__ import annotations

import argparse
import re

from gpumon import __version__
from gpumon.cli.arg_types import (
    DEMO_SCENARIOS,
    SHELLS,
    count,
    duration,
    interval,
    percent,
    positive_int,
    report_by,
    scenario,
    signal_name,
    size,
    span,
    unix_time,
    when,
)
from gpumon.errors import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the bad part, with exit status 2, and no
    abbreviated options (`run --host` is not `--hosts`, and a prefix never changes meaning when an
    option is added)."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _default(value, suppress: bool):
    return argparse.SUPPRESS if suppress else value


def _add_config_option(parser: argparse.ArgumentParser, suppress: bool) -> None:
    parser.add_argument("--config", default=_default(None, suppress), metavar="FILE",
                        help="config file (default ~/.config/gpumon/config.toml, or $GPUMON_CONFIG)")


def _add_source_options(parser: argparse.ArgumentParser, suppress: bool, replay: bool = True) -> None:
    """Where samples come from, and how often."""
    g = parser.add_argument_group("where the data comes from")
    g.add_argument("--interval", type=interval, default=_default(None, suppress), metavar="SECONDS",
                   help="seconds between samples (default 1.0, at least 0.1)")
    g.add_argument("--demo", action="store_true", default=_default(False, suppress),
                   help="simulated GPUs, no driver needed")
    g.add_argument("--scenario", type=scenario, default=_default(None, suppress), metavar="NAME",
                   help=f"the demo's scenario: {', '.join(DEMO_SCENARIOS)} (implies --demo)")
    g.add_argument("--seed", type=int, default=_default(0, suppress), help="random seed of --demo (default 0)")
    if replay:
        g.add_argument("--replay", default=_default(None, suppress), metavar="FILE", help="play back a recording")
    g.add_argument("--nvml-lib", default=_default(None, suppress), metavar="PATH",
                   help="load this libnvidia-ml.so.1 (also $GPUMON_NVML_LIB)")
    _add_path_options(g, suppress)
    _add_config_option(g, suppress)


def _add_path_options(g, suppress: bool) -> None:
    """Where the kernel's file systems are (node_exporter's names): a host's, mounted in a container."""
    g.add_argument("--path.sysfs", dest="path_sysfs", default=_default(None, suppress), metavar="PATH",
                   help="sysfs, for AMD and Intel cards (default /sys; config [paths] sysfs)")
    g.add_argument("--path.procfs", dest="path_procfs", default=_default(None, suppress), metavar="PATH",
                   help="procfs, for their processes (default /proc; config [paths] procfs)")


def _add_ssh_options(g, suppress: bool) -> None:
    g.add_argument("--ssh", default=_default(None, suppress), metavar="CMD",
                   help="the ssh command line, split like a shell would (default ssh; also $GPUMON_SSH)")
    g.add_argument("--remote-gpumon", default=_default(None, suppress), metavar="PATH",
                   help="gpumon on the hosts: a path, or words like '~/venv/bin/python -m gpumon' (default gpumon)")


def _prometheus_url(text: str) -> str:
    from gpumon.fleet.prometheus.api import parse_url

    try:
        return parse_url(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("bad --prometheus-url ")) from None


def _add_fleet_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Many hosts, over the user's own ssh, or read through a Prometheus server."""
    g = parser.add_argument_group("many hosts (over ssh, or read through Prometheus)")
    g.add_argument("--hosts", default=_default(None, suppress), metavar="LIST",
                   help="ssh destinations or aliases, gpu[01-08], @group (config [fleet.groups]), "
                        "ssh://user@host:port, local")
    g.add_argument("--hostfile", default=_default(None, suppress), metavar="FILE", help="hosts, one or more a line")
    _add_ssh_options(g, suppress)
    g.add_argument("--prometheus-url", type=_prometheus_url, default=_default(None, suppress), metavar="URL",
                   help="read every GPU host this Prometheus server scrapes (dcgm-exporter or gpumon watch "
                        "--prometheus), read-only; every 5 s unless --interval is given. A login: http://user@host "
                        "and the password in $GPUMON_PROMETHEUS_PASSWORD (or the config, or ~/.netrc)")
    g.add_argument("--local", action="store_true", default=_default(False, suppress),
                   help="this machine alone, not the hosts of the config's [fleet] (--hosts local: this machine "
                        "as a host of a fleet)")


def _add_timeout_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeout", type=interval, default=5.0, metavar="SECONDS",
                        help="answer within this long; cards still silent are shown as not responding (default 5)")


def _add_record_option(parser: argparse.ArgumentParser, suppress: bool) -> None:
    parser.add_argument("--record", default=_default(None, suppress), metavar="FILE",
                        help="append every sample to FILE as JSON lines (.gz: compressed)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpumon", description="Terminal GPU monitor and launcher for NVIDIA, AMD and Intel cards.")
    parser.add_argument("--version", action="version", version=f"gpumon {__version__}")
    _add_source_options(parser, suppress=False)
    _add_fleet_options(parser, suppress=False)
    tui = parser.add_argument_group("the interactive monitor (no COMMAND)")
    _add_record_option(tui, suppress=False)
    tui.add_argument("--theme", metavar="NAME", help="colour theme")
    tui.add_argument("--no-color", action="store_true", help="no colours (also when $NO_COLOR is set)")
    tui.add_argument("--readonly", action="store_true", help="no process actions or launches")
    tui.add_argument("--low-bandwidth", action="store_true",
                     help="for slow links: redraw every few seconds, not every sample (key b toggles)")
    tui.add_argument("--alert", action="append", default=[], metavar="RULE",
                     help="show a badge on cards where RULE fires (repeatable)")
    parser.set_defaults(subcommand="tui")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("snapshot", help="print one sample as a table or JSON")
    p.add_argument("--json", action="store_true", help="the schema-1 JSON document")
    p.add_argument("--stream", action="store_true",
                   help="with --json: a document per line every --interval until stdin or stdout closes")
    _add_timeout_option(p)
    _add_source_options(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="snapshot")

    p = sub.add_parser("health", help="is any card going bad? exit 0 ok, 1 warn, 2 fail (or a usage error)",
                       description="One line per card with its verdict, reasons and actions. Exit status: 0 all "
                                   "ok, 1 a card warns, 2 a card fails, 3 no usable driver (not loaded, or a "
                                   "driver/library mismatch); a usage error is 2 too, told apart by "
                                   "its one line on stderr and nothing on stdout.")
    p.add_argument("--json", action="store_true", help="the verdicts and counters as JSON")
    p.add_argument("--kernel-log", metavar="PATH", default=None,
                   help="where no gpumon watch runs, read the XIDs before this run from this kernel log "
                        "(/dev/kmsg records; default /dev/kmsg, else the journal)")
    _add_timeout_option(p)
    _add_source_options(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="health")

    p = sub.add_parser("serve", help="a read-only live web page of the cards, for the team (this machine or --hosts)",
                       description="Serves one page with every card, its health, who holds it and which are free, "
                                   "updated live, plus /api/snapshot and /api/health. Read-only. Beyond loopback "
                                   "every request needs the access token (printed in the URL the first time).")
    p.add_argument("--listen", metavar="ADDR",
                   help="HOST:PORT, :PORT or [IPv6]:PORT (default 127.0.0.1:8080; config [serve] listen)")
    _add_source_options(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="serve")

    p = sub.add_parser("users", help="who holds the cards: per user and per Slurm job, pod or container, and idle",
                       description="Samples for --window, then prints a row per user and per Slurm job, Kubernetes "
                                   "pod or container holding cards: cards, GPU memory, SM %%, power share, energy "
                                   "over the window, time held, and idle time (every process at 0 %% SM). Idle time "
                                   "counts from the first sample: a longer --window sees longer idleness; `watch "
                                   "--alert 'idle > 30m'` and the TUI count from their start.")
    p.add_argument("--json", action="store_true", help="the holders as JSON")
    p.add_argument("--window", type=duration, metavar="DURATION",
                   help="watch this long before printing, e.g. 30s, 10m (default: 2 intervals, 3 samples)")
    _add_source_options(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="users")

    p = sub.add_parser("report", help="who used the cards: GPU-hours, energy, idle-held hours per user, job, card, day",
                       description="Reads the usage history `gpumon watch` (or the TUI, where no watch runs) "
                                   "records ([history] in the config), or a Prometheus server's. GPU-hours are "
                                   "card-hours held; idle-held hours: held with every process at 0 %% SM. Exit "
                                   "status 1 when there is no history to read.")
    since = p.add_mutually_exclusive_group()
    since.add_argument("--since", type=span, metavar="SPAN", help="the last SPAN: 30m, 12h, 7d, 2w (default 7d)")
    since.add_argument("--from", dest="start", type=when, metavar="WHEN",
                       help="from this date or time: 2026-12-01, 2026-12-01T14:00 (local time), or unix seconds")
    p.add_argument("--to", dest="end", type=when, metavar="WHEN", help="until this date or time (default: now)")
    p.add_argument("--by", type=report_by, default="user", metavar="WHAT",
                   help="rows per user (with their jobs, pods, containers), job, card or day (default user)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="the report as JSON")
    out.add_argument("--csv", action="store_true", help="the rows as CSV")
    out.add_argument("--plot", action="store_true", help="also draw each card's utilisation per day")
    _add_config_option(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="report")

    p = sub.add_parser("topo", help="GPU link matrix with CPU and NUMA affinity")
    p.add_argument("--json", action="store_true", help="the same as JSON")
    _add_timeout_option(p)
    _add_source_options(p, suppress=True)
    p.set_defaults(subcommand="topo")

    p = sub.add_parser("select", help="print a CUDA_VISIBLE_DEVICES value for the best free cards")
    p.add_argument("--count", type=positive_int, default=1, metavar="N", help="how many cards (default 1)")
    p.add_argument("--min-free", type=size, metavar="SIZE", help="free memory each card needs: 8G, 512M, 50%%")
    p.add_argument("--max-util", type=percent, metavar="PCT",
                   help="a card busier than this is not free (default 10)")
    p.add_argument("--max-used", type=size, metavar="SIZE",
                   help="a card with more memory in use than this is not free (default 10%%)")
    p.add_argument("--verbose", action="store_true", help="say on stderr why these cards")
    p.add_argument("--export", action="store_true",
                   help="print shell commands that pin this shell to them: eval \"$(gpumon select --export)\"")
    p.add_argument("--shell", choices=("sh", "bash", "zsh", "ksh", "dash", "fish"), metavar="SHELL",
                   help="with --export: the shell's syntax (sh, bash, zsh, ksh, dash: POSIX; fish)")
    p.add_argument("--claim", action="store_true",
                   help="claim the cards while the shell that ran gpumon lives: "
                        "eval \"$(gpumon select --claim --export)\"")
    p.add_argument("--claim-for", type=positive_int, metavar="PID", help="claim them while process PID lives")
    _add_timeout_option(p)
    _add_source_options(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="select")

    p = sub.add_parser("watch", help="headless: sample, evaluate alert rules, print events")
    p.add_argument("--alert", action="append", default=[], metavar="RULE",
                   help="alert rule, e.g. 'temp > 85 for 30s' (repeatable; adds to the config's)")
    p.add_argument("--format", choices=("jsonl", "text"), help="event lines (default: jsonl unless a terminal)")
    p.add_argument("--count", type=positive_int, metavar="N", help="stop after N samples")
    p.add_argument("--exit-on-alert", action="store_true", help="exit with status 1 at the first firing alert")
    p.add_argument("--on-alert", metavar="CMD", help="run CMD with sh -c per event; event on stdin and in GPUMON_*")
    p.add_argument("--hook-timeout", type=interval, metavar="SECONDS", help="kill a hook after this long (default 10)")
    p.add_argument("--prometheus", metavar="ADDR", help="serve metrics on PORT or HOST:PORT (default host 127.0.0.1)")
    p.add_argument("--prometheus-processes", action="store_true", help="also export per-process GPU memory")
    p.add_argument("--prometheus-hostname", metavar="NAME",
                   help="the metrics' Hostname label (default: this machine's name; set it in a container)")
    p.add_argument("--web-config-file", metavar="FILE",
                   help="TLS and basic auth for --prometheus: a Prometheus exporter-toolkit web config "
                        "(tls_server_config, basic_auth_users), as node_exporter's --web.config.file")
    p.add_argument("--metrics", action="store_true", help="also print a metrics line per sample")
    _add_record_option(p, suppress=True)
    _add_source_options(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="watch")

    p = sub.add_parser("run", help="launch a command pinned to a card (detached unless --foreground)",
                       usage="gpumon run [OPTIONS] -- CMD [ARG...]")
    p.add_argument("--gpu", default="auto", metavar="SPEC",
                   help="index, UUID, PCI bus id, comma list, or auto[:N] (default auto: least loaded)")
    p.add_argument("--mem-limit", type=size, metavar="SIZE", help="GPU memory cap per card: 8G, 512M, 50%%")
    p.add_argument("--no-numa", action="store_true", help="do not pin to the card's CPUs")
    p.add_argument("--foreground", action="store_true", help="run in this terminal and wait for it")
    p.add_argument("--name", help="a name for the job (default: the program's name)")
    p.add_argument("--wait", action="store_true", help="join the host's queue (every user's, in order) for cards")
    p.add_argument("--wait-timeout", type=duration, metavar="DURATION",
                   help="with --wait: give up after this long (status 1), and wait here until then")
    p.add_argument("--min-free", type=size, metavar="SIZE", help="with auto or --wait: free memory needed")
    p.add_argument("--max-util", type=percent, metavar="PCT",
                   help="with auto or --wait: highest utilisation (default 10)")
    p.add_argument("--cwd", metavar="DIR", help="working directory (default: here)")
    p.add_argument("--systemd", action="store_true", help="run as a transient systemd user unit")
    p.add_argument("--as-typed", action="store_true",
                   help="a container command that asks its engine for other cards (--gpus all, a count): "
                        "start it anyway, with a warning, its request kept")
    p.add_argument("--failover", type=count, default=0, metavar="N",
                   help="when the job's card fails (lost, fatal XID, fabric failed): stop it and start it "
                        "again on other free cards, up to N times (default 0: never)")
    p.add_argument("--host", metavar="HOST", help="launch there, over ssh (its gpumon pins and supervises the job)")
    p.add_argument("--json", action="store_true",
                   help='answer with the job it started: {"job": <a jobs --json entry>, "summary": [lines]}')
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")
    _add_source_options(p, suppress=True, replay=False)
    _add_fleet_options(p, suppress=True)  # --hosts with --gpu auto[:N]: the best free set on one of them
    p.set_defaults(subcommand="run")

    p = sub.add_parser("queue", help="the host's queue of jobs waiting for cards (run --wait), every user's")
    p.add_argument("--json", action="store_true", help="as JSON, next to start first")
    _add_config_option(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="queue")

    p = sub.add_parser("reserve", help="book cards for a while: others' auto placement, select and queue skip them")
    p.add_argument("--gpu", metavar="N[,M...]", help="the cards: indices, UUIDs or PCI bus ids")
    p.add_argument("--for", dest="duration", type=duration, metavar="DURATION", help="how long: 30m, 2h, 1d")
    p.add_argument("--note", metavar="TEXT", help="what for, shown beside the reservation")
    p.add_argument("--list", action="store_true", help="list the host's reservations")
    p.add_argument("--json", action="store_true", help="with --list: as JSON")
    _add_timeout_option(p)
    _add_source_options(p, suppress=True, replay=False)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="reserve")

    p = sub.add_parser("release", help="end your reservations (all, or those of --gpu)")
    p.add_argument("--gpu", metavar="N[,M...]", help="only these cards")
    _add_timeout_option(p)
    _add_source_options(p, suppress=True, replay=False)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="release")

    p = sub.add_parser("jobs", help="jobs launched by gpumon")
    p.add_argument("--json", action="store_true", help="as JSON, oldest first")
    p.add_argument("--prune", action="store_true", help="remove the records of finished jobs")
    p.add_argument("--stop", metavar="ID", help="stop a job (SIGTERM, then SIGKILL after a grace period)")
    p.add_argument("--log", metavar="ID", help="print a job's output")
    p.add_argument("--follow", action="store_true", help="with --log: keep printing until the job ends")
    _add_config_option(p, suppress=True)
    _add_fleet_options(p, suppress=True)
    p.set_defaults(subcommand="jobs")

    p = sub.add_parser("signal", help="signal one of your processes, checked by pid and start time")
    p.add_argument("pid", type=positive_int, metavar="PID")
    p.add_argument("--signal", type=signal_name, default="terminate", metavar="NAME",
                   help="TERM (default), KILL or INT")
    p.add_argument("--started", type=unix_time, metavar="T",
                   help="its start time (unix s, as in the snapshot): a recycled pid is never signalled; "
                        "without it, PID 1, kernel threads and other users' session leaders are refused")
    _add_config_option(p, suppress=True)
    p.set_defaults(subcommand="signal")

    p = sub.add_parser("alerts", help="alert rules: export them for Prometheus")
    alerts = p.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser, required=True)
    e = alerts.add_parser("export", help="write the configured rules as a Prometheus alerting-rules file")
    e.add_argument("--prometheus-rules", action="store_true", required=True, help="Prometheus rules YAML")
    e.add_argument("--alert", action="append", default=[], metavar="RULE", help="rule (adds to the config's)")
    _add_config_option(e, suppress=True)
    e.set_defaults(subcommand="alerts")

    p = sub.add_parser("doctor", help="is this machine set up for gpumon? one line per check, with the fix",
                       description="Checks the driver library and NVML, other users' processes, cgroups, the "
                                   "config, the claims folder, ssh to each configured host, the exporter's port "
                                   "and Textual. Exit status: 0 all ok, 1 a warning, 2 a failure.")
    p.add_argument("--json", action="store_true", help="the checks as JSON")
    p.add_argument("--nvml-lib", default=argparse.SUPPRESS, metavar="PATH",
                   help="check this libnvidia-ml.so.1 (also $GPUMON_NVML_LIB)")
    _add_config_option(p, suppress=True)
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
    _add_config_option(p, suppress=True)
    p.set_defaults(subcommand="config")
    return parser


def _options_with_values(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string, of the parser and its subcommands, that takes a value."""
    found: set[str] = set()
    for action in parser._actions:
        if action.option_strings and action.nargs != 0:
            found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _options_with_values(sub)
    return found


_NEGATIVE = re.compile(r"^-[0-9.]")  # `--mem-limit -5G`: a bad value, not an option


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    return {name for action in parser._actions if isinstance(action, argparse._SubParsersAction)
            for name in action.choices}


def normalise_argv(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """Accept the older `--demo SCENARIO` as `--demo --scenario SCENARIO`.

    Only gpumon's own options are looked at: nothing after `--`, and nothing from the first word of
    `run`'s command on, is ever changed (`gpumon run -- python sim.py --demo` runs exactly that).
    """
    with_values = _options_with_values(parser)
    out: list[str] = []
    i = 0
    in_run = False
    while i < len(argv):
        arg = argv[i]
        if arg == "--" or (in_run and not arg.startswith("-")):
            return out + argv[i:]  # the user's command: untouched
        if arg == "--demo" and i + 1 < len(argv) and argv[i + 1] in DEMO_SCENARIOS:
            out += ["--demo", "--scenario", argv[i + 1]]
            i += 2
            continue
        if arg.startswith("--demo="):
            out += ["--demo", "--scenario", scenario(arg.partition("=")[2], usage=True)]
            i += 1
            continue
        # `--demo bogus` is not the command `bogus`: name the scenario that does not exist. (In `run`,
        # the word after --demo is the command to run.)
        if arg == "--demo" and not in_run and i + 1 < len(argv) and not argv[i + 1].startswith("-") \
                and argv[i + 1] not in _subcommands(parser):
            scenario(argv[i + 1], usage=True)
        out.append(arg)
        i += 1
        if arg in with_values and i < len(argv):
            if arg.startswith("--") and _NEGATIVE.match(argv[i]):
                out[-1] = f"{arg}={argv[i]}"  # argparse takes `-5G` for an option; joined, it is the value
            else:
                out.append(argv[i])  # the option's value, whatever it looks like
            i += 1
        elif arg == "run" and not in_run:
            in_run = True
    return out
