"""Command line: parse arguments, run a subcommand, turn errors into one line and an exit status."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence

from gpumon import __version__
from gpumon.errors import EXIT_ALERT, EXIT_OK, EXIT_USAGE, GpumonError, UsageError
from gpumon.sanitize import printable

SUBCOMMANDS = ("snapshot", "topo", "select", "watch", "alerts", "run", "jobs")
MIN_INTERVAL = 0.1
EXIT_INTERNAL = 70  # EX_SOFTWARE: a bug in gpumon, not the user's input


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the bad part, with exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= MIN_INTERVAL:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be at least {MIN_INTERVAL} s, got {text}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def _percent(text: str) -> float:
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0 and 100, got {text}")
    return value


def _size(text: str) -> str:
    """Checks SIZE syntax now; a percentage is resolved later against each card's total."""
    from gpumon.units import parse_size

    try:
        parse_size(text, total=1 << 40)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _add_global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    # Subcommands repeat the global options (so `gpumon snapshot --demo` works); SUPPRESS keeps a
    # subparser's defaults from overwriting values given before the subcommand.
    d = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    g = parser.add_argument_group("global options")
    g.add_argument("--interval", type=_interval, default=d(None), metavar="SECONDS",
                   help="seconds between samples (default 1.0, at least 0.1)")
    g.add_argument("--demo", nargs="?", const="default", default=d(None), metavar="SCENARIO",
                   help="simulated GPUs, no driver needed: default, workstation, hot, lost")
    g.add_argument("--seed", type=int, default=d(0), help="random seed of --demo (default 0)")
    g.add_argument("--replay", default=d(None), metavar="FILE", help="play back a recording")
    g.add_argument("--nvml-lib", default=d(None), metavar="PATH",
                   help="load this libnvidia-ml.so.1 (also $GPUMON_NVML_LIB)")
    g.add_argument("--theme", default=d(None), metavar="NAME", help="TUI colour theme")
    g.add_argument("--no-color", action="store_true", default=d(False),
                   help="no colours (also when $NO_COLOR is set)")
    g.add_argument("--config", default=d(None), metavar="FILE",
                   help="config file (default ~/.config/gpumon/config.toml, or $GPUMON_CONFIG)")
    g.add_argument("--record", default=d(None), metavar="FILE",
                   help="append every sample to FILE as JSON lines (.gz: compressed)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="gpumon", description="Terminal GPU monitor and launcher for NVIDIA machines.")
    parser.add_argument("--version", action="version", version=f"gpumon {__version__}")
    _add_global_options(parser, suppress=False)
    parser.add_argument("--readonly", action="store_true", help="TUI: no process actions")
    parser.add_argument("--alert", action="append", default=[], metavar="RULE",
                        help="TUI: show a badge on cards where RULE fires (repeatable)")
    parser.set_defaults(func=cmd_tui)
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("snapshot", help="print one sample as a table or JSON")
    p.add_argument("--json", action="store_true", help="the schema-1 JSON document")
    _add_global_options(p, suppress=True)
    p.set_defaults(func=cmd_snapshot)

    p = sub.add_parser("topo", help="GPU link matrix with CPU and NUMA affinity")
    p.add_argument("--json", action="store_true", help="the same as JSON")
    _add_global_options(p, suppress=True)
    p.set_defaults(func=cmd_topo)

    p = sub.add_parser("select", help="print a CUDA_VISIBLE_DEVICES value for the best free cards")
    p.add_argument("--count", type=_positive_int, default=1, metavar="N", help="how many cards (default 1)")
    p.add_argument("--min-free", type=_size, metavar="SIZE", help="free memory each card needs: 8G, 512M, 50%%")
    p.add_argument("--max-util", type=_percent, metavar="PCT", help="highest utilisation allowed")
    p.add_argument("--verbose", action="store_true", help="say on stderr why these cards")
    _add_global_options(p, suppress=True)
    p.set_defaults(func=cmd_select)

    p = sub.add_parser("watch", help="headless: sample, evaluate alert rules, print events")
    p.add_argument("--alert", action="append", default=[], metavar="RULE",
                   help="alert rule, e.g. 'temp > 85 for 30s' (repeatable; adds to the config's)")
    p.add_argument("--format", choices=("jsonl", "text"), help="event lines (default: jsonl unless a terminal)")
    p.add_argument("--count", type=_positive_int, metavar="N", help="stop after N samples")
    p.add_argument("--exit-on-alert", action="store_true", help="exit with status 1 at the first firing alert")
    p.add_argument("--on-alert", metavar="CMD", help="run CMD with sh -c per event; event on stdin and in GPUMON_*")
    p.add_argument("--hook-timeout", type=_interval, metavar="SECONDS", help="kill a hook after this long (default 10)")
    p.add_argument("--prometheus", metavar="ADDR", help="serve metrics on PORT or HOST:PORT (default host 127.0.0.1)")
    p.add_argument("--prometheus-processes", action="store_true", help="also export per-process GPU memory")
    p.add_argument("--metrics", action="store_true", help="also print a metrics line per sample")
    _add_global_options(p, suppress=True)
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("run", help="launch a command pinned to a card (detached unless --foreground)")
    p.add_argument("--gpu", default="auto", metavar="SPEC",
                   help="index, UUID, PCI bus id, comma list, or auto[:N] (default auto: least loaded)")
    p.add_argument("--mem-limit", type=_size, metavar="SIZE", help="GPU memory cap per card: 8G, 512M, 50%%")
    p.add_argument("--no-numa", action="store_true", help="do not pin to the card's CPUs")
    p.add_argument("--foreground", action="store_true", help="run in this terminal and wait for it")
    p.add_argument("--name", help="a name for the job (default: the command)")
    p.add_argument("--wait", action="store_true", help="queue until matching cards are free, then start")
    p.add_argument("--min-free", type=_size, metavar="SIZE", help="with auto or --wait: free memory needed")
    p.add_argument("--max-util", type=_percent, metavar="PCT", help="with auto or --wait: highest utilisation")
    p.add_argument("--cwd", metavar="DIR", help="working directory (default: here)")
    p.add_argument("--systemd", action="store_true", help="run as a transient systemd user unit")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")
    _add_global_options(p, suppress=True)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("jobs", help="jobs launched by gpumon")
    p.add_argument("--json", action="store_true", help="as JSON, oldest first")
    p.add_argument("--prune", action="store_true", help="remove the records of finished jobs")
    p.add_argument("--stop", metavar="ID", help="stop a job (SIGTERM, then SIGKILL after a grace period)")
    _add_global_options(p, suppress=True)
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser("alerts", help="alert rules: export them for Prometheus")
    alerts = p.add_subparsers(title="commands", metavar="COMMAND", parser_class=_Parser, required=True)
    e = alerts.add_parser("export", help="write the configured rules as a Prometheus alerting-rules file")
    e.add_argument("--prometheus-rules", action="store_true", required=True, help="Prometheus rules YAML")
    e.add_argument("--alert", action="append", default=[], metavar="RULE", help="rule (adds to the config's)")
    _add_global_options(e, suppress=True)
    e.set_defaults(func=cmd_alerts_export)
    return parser


def _normalise_argv(argv: list[str]) -> list[str]:
    """`--demo snapshot` means the default scenario, not a scenario called "snapshot"."""
    out = []
    for i, arg in enumerate(argv):
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if arg == "--demo" and (nxt is None or nxt.startswith("-") or nxt in SUBCOMMANDS):
            arg = "--demo=default"
        out.append(arg)
    return out


def _backend(args: argparse.Namespace):
    from gpumon.backends import open_backend

    if args.demo is not None and args.replay is not None:
        raise UsageError("--demo and --replay cannot be used together")
    return open_backend(demo=args.demo, replay=args.replay, nvml_lib=args.nvml_lib, seed=args.seed)


def _read_once(args: argparse.Namespace, read):
    backend = _backend(args)
    try:
        return read(backend)
    finally:
        backend.close()


def _print(args: argparse.Namespace, data, as_text) -> int:
    """The --json document, or the table for people."""
    if args.json:
        json.dump(data.to_dict(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(as_text(data))
    return EXIT_OK


def cmd_snapshot(args: argparse.Namespace) -> int:
    from gpumon.report import snapshot_text
    from gpumon.sampler import sample_once

    return _print(args, _read_once(args, sample_once), snapshot_text)


def cmd_topo(args: argparse.Namespace) -> int:
    from gpumon.report import topology_text

    return _print(args, _read_once(args, lambda backend: backend.topology()), topology_text)


def cmd_select(args: argparse.Namespace) -> int:
    from gpumon.placement import choose
    from gpumon.sampler import sample_once

    backend = _backend(args)
    try:
        snapshot = sample_once(backend)
        topo = backend.topology() if args.count > 1 else None
    finally:
        backend.close()
    try:
        choice = choose(snapshot, args.count, topo, min_free=args.min_free, max_util=args.max_util)
    except ValueError as exc:
        print(f"gpumon: {exc}", file=sys.stderr)
        return EXIT_ALERT  # like grep: ran fine, found nothing
    if args.verbose:
        for reason in choice.reasons:
            print(f"gpumon: {reason}", file=sys.stderr)
    print(",".join(g.uuid for g in choice.gpus))
    return EXIT_OK


def _config(args: argparse.Namespace):
    from gpumon.config import load_config

    config = load_config(args.config)
    if args.interval is None:
        args.interval = config.interval or 1.0
    return config


def cmd_watch(args: argparse.Namespace) -> int:
    import asyncio

    from gpumon.alerts import AlertEngine, parse_rules
    from gpumon.export import EventWriter
    from gpumon.hooks import HookRunner
    from gpumon.record import Recorder
    from gpumon.sampler import Sampler
    from gpumon.watch import Watch

    config = _config(args)
    rules = parse_rules(config.watch_rules + config.rules + args.alert)
    fmt = args.format or config.format or ("text" if sys.stdout.isatty() else "jsonl")
    backend = _backend(args)
    replaying = args.replay is not None
    count = args.count
    if replaying:  # as fast as the data comes: rule durations use the recorded times
        remaining = len(backend.snapshots)
        count = min(count, remaining) if count else remaining
    on_alert = args.on_alert or config.on_alert
    hooks = HookRunner(on_alert, args.hook_timeout or config.hook_timeout) if on_alert else None
    recorder = Recorder(args.record) if args.record else None
    per_process = args.prometheus_processes or config.prometheus_processes
    # Events never name processes: psutil is needed only to record them or export them.
    enrich = recorder is not None or per_process
    watch = Watch(
        Sampler(backend, interval=0.0 if replaying else args.interval, enrich=enrich), AlertEngine(rules),
        EventWriter(sys.stdout, fmt), hooks, recorder, args.exit_on_alert, args.metrics, count,
    )
    server = None
    try:
        address = args.prometheus or config.prometheus
        if address:
            server = watch.serve_prometheus(address, per_process)
        return asyncio.run(watch.run())
    finally:
        if server is not None:
            server.shutdown()
        if hooks is not None:
            hooks.close()
        if recorder is not None:
            recorder.close()
        backend.close()


def cmd_alerts_export(args: argparse.Namespace) -> int:
    from gpumon.alerts import parse_rules
    from gpumon.export import prometheus_rules

    config = _config(args)
    sys.stdout.write(prometheus_rules(parse_rules(config.watch_rules + config.rules + args.alert)))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    from gpumon.launch import LaunchRequest, launch

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    request = LaunchRequest(
        command=command, gpu_spec=args.gpu, mem_limit=args.mem_limit, numa=not args.no_numa,
        foreground=args.foreground, name=args.name, wait=args.wait, min_free=args.min_free,
        max_util=args.max_util, cwd=args.cwd, systemd=args.systemd,
    )
    if args.interval is None:
        args.interval = 1.0
    backend = _backend(args)
    try:
        return launch(request, backend, backend_args=_backend_args(args), interval=args.interval, out=sys.stdout)
    finally:
        backend.close()


def _backend_args(args: argparse.Namespace) -> dict:
    """How a job's supervisor reaches the same driver as this command."""
    return {"demo": args.demo, "seed": args.seed, "nvml_lib": args.nvml_lib or os.environ.get("GPUMON_NVML_LIB")}


def cmd_jobs(args: argparse.Namespace) -> int:
    from gpumon import jobs
    from gpumon.report import jobs_text

    if args.prune:
        removed = jobs.prune()
        print(f"removed {len(removed)} finished job{'s' if len(removed) != 1 else ''}")
        return EXIT_OK
    if args.stop:
        print(jobs.stop(jobs.find_job(args.stop)))
        return EXIT_OK
    listed = jobs.list_jobs()
    if args.json:
        json.dump([job.to_dict() for job in listed], sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(jobs_text(listed))
    return EXIT_OK


def cmd_tui(args: argparse.Namespace) -> int:
    from gpumon.alerts import parse_rules
    from gpumon.tui.app import run_app

    config = _config(args)
    rules = parse_rules(config.rules + config.watch_rules + args.alert)
    args.theme = args.theme or config.theme
    args.readonly = args.readonly or config.readonly
    return run_app(args, _backend(args), rules, _backend_args(args))


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=os.environ.get("GPUMON_LOG", "WARNING").upper(),
                        format="gpumon: %(message)s")
    try:
        args = build_parser().parse_args(_normalise_argv(list(sys.argv[1:] if argv is None else argv)))
        return args.func(args)
    except GpumonError as exc:
        # Messages quote what the user typed: no control characters (newlines included) may reach
        # the terminal. Only an alert rule's error has lines of its own: the rule and a caret.
        from gpumon.alerts import RuleError

        text = str(exc)
        lines = [printable(line) for line in text.split("\n")] if isinstance(exc, RuleError) else [printable(text)]
        print("gpumon: error: " + "\n".join(lines), file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `gpumon snapshot | head`
        sys.stderr.close()
        return EXIT_OK
    except SystemExit as exc:  # --help / --version
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except Exception as exc:  # a bug: one line for the user, the traceback on request
        if os.environ.get("GPUMON_DEBUG"):
            raise
        print(f"gpumon: internal error: {type(exc).__name__}: {printable(str(exc))} (GPUMON_DEBUG=1 shows the traceback; "
              "please report it)", file=sys.stderr)
        return EXIT_INTERNAL
