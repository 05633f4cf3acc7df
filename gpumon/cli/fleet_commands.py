"""The headless commands with `--hosts`: snapshot, select, jobs, and `run --host` / `run --hosts`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed

from gpumon.cli import fleet
from gpumon.cli.common import fleet_requested, load_settings, print_document
from gpumon.cli.tables import snapshot_text, table
from gpumon.errors import EXIT_ALERT, EXIT_OK, UsageError
from gpumon.jobs.across_hosts import choose_across, wants_topology
from gpumon.jobs.claims_and_queue import CardsTaken, LaunchSharing
from gpumon.jobs.host import MAX_PARALLEL, HostError, host_at, host_for, topologies_of
from gpumon.jobs.launch import LaunchRequest
from gpumon.jobs.placement import auto_count
from gpumon.model import FleetSnapshot, HostStatus, Topology
from gpumon.remote.children import end_all
from gpumon.remote.hosts import parse_entry
from gpumon.settings import Settings
from gpumon.sharing.folder import SharingSettings
from gpumon.units import format_bytes, format_runtime


def _refuse_prometheus(args: argparse.Namespace, what: str) -> None:
    """Jobs, logs and launches need gpumon on the host, over ssh: Prometheus cannot reach it."""
    if getattr(args, "prometheus_url", None):
        raise UsageError(f"{what} through Prometheus: it has no way to reach the nodes "
                         "(--prometheus-url is read-only; reach them over ssh with --host or --hosts)")


def host_text(status: HostStatus) -> str:
    """One host's part of `snapshot --hosts`: its state line, then its cards."""
    head = f"== {status.host}: {status.state}" + (f" ({status.source})" if status.source != "gpumon" else "")
    if status.error and status.state != "live":
        head += f": {status.error}"
    parts = [head + (f"  [{status.note}]" if status.note else "")]
    if status.snapshot is not None and status.state in ("live", "stale"):
        parts.append(snapshot_text(status.snapshot))
    return "\n".join(parts) + "\n"


def fleet_text(doc: FleetSnapshot) -> str:
    return "".join(host_text(status) for status in doc.hosts)


def _now(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def snapshot_hosts(args: argparse.Namespace) -> int:
    """For people, each host as it answers (a slow host holds up no other); --json, one document."""
    settings = load_settings(args)
    config = settings.config
    hosts = fleet.host_list(args, config)
    if args.json:
        doc = fleet.collect(args, settings, hosts)
        print_document(args, doc, fleet_text)
    else:
        doc = fleet.collect(args, settings, hosts, on_answer=lambda status: _now(host_text(status)))
    return fleet.read_status(doc.hosts)


def select_hosts(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    config = settings.config
    hosts = fleet.host_list(args, config)
    doc = fleet.collect(args, settings, hosts)
    runner = fleet.build(args, settings, hosts)

    bars = {"min_free": args.min_free, "max_util": args.max_util, "max_used": args.max_used}
    topologies = _topologies(runner, list(doc.hosts), args.count, **bars)
    best, reasons = choose_across(list(doc.hosts), args.count, topologies.get, **bars, here=_here(settings.sharing))
    if args.verbose or best is None:
        for reason in reasons:
            print(f"gpumon: {reason}", file=sys.stderr)
    if best is None:
        print(f"gpumon: no host has {args.count} free card{'s' if args.count > 1 else ''}", file=sys.stderr)
        # Too few free on the hosts read (1, as on one machine), unless some could not say.
        read = fleet.read_status(doc.hosts)
        return EXIT_ALERT if read == EXIT_OK else read
    if args.verbose:
        for reason in best.choice.reasons:
            print(f"gpumon: {best.host}: {reason}", file=sys.stderr)
    print(f"{best.host}\t{','.join(g.ref or '' for g in best.choice.gpus)}")
    return EXIT_OK


JOB_COLUMNS = ["HOST", "ID", "NAME", "STATE", "GPU", "PID", "EXIT", "RUNTIME", "PEAK MEM", "LOG / REASON"]
_JOB_WIDTHS = [0, 12, 20, 9, 7, 8, 4, 9, 9, 0]  # fixed: rows are printed as their host answers


def _job_cells(job: dict) -> list[str]:
    runtime = None
    if job["started"] is not None:
        runtime = (job["ended"] or time.time()) - job["started"]
    return [
        job["host"], job["id"], (job["name"] or "")[:20],
        "unsupervised" if job.get("supervised") is False else job["state"],
        ",".join(str(i) for i in job["gpu_indices"]) or "-", str(job["pid"] or ""),
        "" if job["exit_code"] is None else str(job["exit_code"]), format_runtime(runtime),
        format_bytes(job["peak_gpu_memory"], na=""), job["reason"] or job["log"] or "",
    ]


def jobs_text(rows: list[dict]) -> str:
    if not rows:
        return "No jobs.\n"
    return table([JOB_COLUMNS, *(_job_cells(job) for job in rows)]) + "\n"


def _job_line(cells: list[str], widths: list[int]) -> str:
    return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip() + "\n"


def _jobs_as_they_come(hosts) -> Iterator[tuple[str, list[dict] | HostError]]:
    """(host, its jobs or why not), each host as it answers: a slow host holds up no other."""
    def listed(host) -> list[dict] | HostError:
        try:
            return host.jobs()
        except HostError as exc:
            return exc

    pool = ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(hosts)))
    try:
        futures = {pool.submit(listed, host): host.name for host in hosts}
        for future in as_completed(futures):
            yield futures[future], future.result()
    except BaseException:  # Ctrl-C: no host still asked holds up the exit
        end_all()
        raise
    finally:
        pool.shutdown(cancel_futures=True)


def _copy(source, sink) -> None:
    while chunk := source.read1(65536):
        sink.write(chunk)
        sink.flush()


def _show_log(host, job_id: str, follow: bool) -> int:
    """The job's own output, as the host sends it. stdin stays open: its end tells the host to stop."""
    proc = host.follow_log(job_id, follow=follow)
    errors = threading.Thread(target=_copy, args=(proc.stderr, sys.stderr.buffer), daemon=True)
    errors.start()
    try:
        _copy(proc.stdout, sys.stdout.buffer)
        errors.join()
        return proc.wait()
    finally:
        if proc.poll() is None:  # Ctrl-C: the remote tail ends with its connection
            proc.terminate()
            proc.wait()


def jobs_hosts(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    config = settings.config
    _refuse_prometheus(args, "cannot list, follow or stop jobs")
    hosts = fleet.host_list(args, config)
    runner = fleet.build(args, settings, hosts)
    if args.stop or args.log:
        if len(hosts) != 1:
            raise UsageError("--stop and --log act on one host: give --hosts HOST")
        host = host_for(runner, hosts[0].name)
        if args.stop:
            print(host.stop(args.stop))
            return EXIT_OK
        return _show_log(host, args.log, args.follow)

    answers: dict[str, list[dict]] = {}
    widths = [max(len(h.name) for h in hosts), *_JOB_WIDTHS[1:]]
    for name, result in _jobs_as_they_come([host_for(runner, h.name) for h in hosts]):
        if isinstance(result, HostError):
            print(f"gpumon: {result} (its jobs are not listed)", file=sys.stderr, flush=True)
            continue
        if not args.json:  # for people, each host's jobs as they come, under one header
            if not answers and result:
                _now(_job_line(JOB_COLUMNS, widths))
            _now("".join(_job_line(_job_cells(job), widths) for job in result))
        answers[name] = result
    rows = [job for h in hosts for job in answers.get(h.name, ())]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif not rows:  # "No jobs." only where every host said so: a host not read may have some
        unread = [h.name for h in hosts if h.name not in answers]
        if not answers:
            sys.stdout.write("No host could be read: their jobs are unknown.\n")
        elif unread:
            sys.stdout.write(f"No jobs on {', '.join(answers)}; {', '.join(unread)} could not be read.\n")
        else:
            sys.stdout.write("No jobs.\n")
    return fleet.answered_status(h.name in answers for h in hosts)


def run_host(args: argparse.Namespace, request: LaunchRequest) -> int:
    """`run --host HOST`, or `run --hosts LIST --gpu auto[:N]`: the best free set on one of them."""
    settings = load_settings(args)
    config = settings.config
    _refuse_prometheus(args, f"cannot launch on {args.host}" if args.host else "cannot launch")
    if not request.command or not request.command[0].strip():
        raise UsageError("no command given: gpumon run --host HOST [OPTIONS] -- CMD [ARG...]")
    if args.host is not None:
        if fleet_requested(args):
            raise UsageError("--host launches on one host; --hosts chooses among several: give one of them")
        spec = parse_entry(args.host)
    else:
        return _run_across(args, settings, request)
    host = host_at(spec, None if spec.is_local else fleet.transport(args, config), fleet.local_args(args))
    if request.foreground:  # the job in this terminal, through a remote terminal
        return host.run_here(request, tty=sys.stdin.isatty())
    print(host.launch(request))
    return EXIT_OK


def _run_across(args: argparse.Namespace, settings: Settings, request: LaunchRequest) -> int:
    """The best free set on one host, launched there as `--gpu auto:N`, so that host's own claims
    and reservations (which its stream does not carry) have the last word: when they leave it no
    free set now, the next best host is tried."""
    spec = request.gpu_spec
    count = auto_count(spec)
    if count is None:
        raise UsageError(f"--gpu {spec} names cards of one host: use --host HOST (--hosts goes with --gpu auto[:N])")
    if request.wait:
        raise UsageError("--wait queues on one host: use --host HOST with --wait")
    config = settings.config
    hosts = fleet.host_list(args, config)
    doc = fleet.collect(args, settings, hosts)
    runner = fleet.build(args, settings, hosts)
    candidates = list(doc.hosts)
    topologies = _topologies(runner, candidates, count, request.min_free, request.max_util)
    taken: list[str] = []
    while True:
        best, reasons = choose_across(candidates, count, topologies.get, request.min_free, request.max_util,
                                      here=_here(settings.sharing))
        if best is None:
            raise UsageError(f"no host has {count} free card(s) for --gpu {spec}: " + "; ".join(taken + reasons))
        print(f"gpumon: {best.host}: " + ", ".join(f"GPU {g.index}" for g in best.choice.gpus), file=sys.stderr)
        host = host_at(runner.specs[best.host], None if runner.specs[best.host].is_local
                       else fleet.transport(args, config), fleet.local_args(args))
        placed = dataclasses.replace(request, gpu_spec=f"auto:{count}")
        if request.foreground:  # the job in this terminal, through a remote terminal
            return host.run_here(placed, tty=sys.stdin.isatty())
        try:
            print(host.launch(placed))
            return EXIT_OK
        except HostError as exc:
            if "cards are free" not in str(exc):  # not a question of free cards: not launched anywhere else
                raise
            print(f"gpumon: {best.host}: no free set there now ({exc}); trying the next host", file=sys.stderr)
            taken.append(f"{best.host}: its cards are claimed or reserved")
            candidates = [h for h in candidates if h.host != best.host]


def _here(shared: SharingSettings) -> CardsTaken:
    """What this machine's launches claim and its users reserve (for the host `local`)."""
    return LaunchSharing(shared, lambda line: print(f"gpumon: {line}", file=sys.stderr)).taken_now()


def _topologies(runner, hosts, count: int, min_free: str | None = None, max_util: float | None = None,
                max_used: str | None = None) -> dict[str, Topology]:
    """The link topology of every host that could take the job, asked of them all at once: the
    answer takes as long as the slowest host, not the sum of them."""
    names = [h for h in wants_topology(hosts, count, min_free, max_util, max_used) if h in runner.specs]
    if not names:  # (hosts read through Prometheus have no way to be asked)
        return {}

    answers, errors = topologies_of([host_for(runner, name) for name in names])
    for error in errors:  # placed without link ranks then, like a card set of unknown links
        print(f"gpumon: {error} (placing without its topology)", file=sys.stderr)
    return answers
