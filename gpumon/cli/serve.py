"""`gpumon serve [--listen ADDR] [--hosts …|--prometheus-url …]`: the read-only web page (gpumon/web/).

This machine's cards from one Sampler, or a fleet's (the hosts named, else the config's [fleet],
as the TUI reads them) from one Fleet, whatever the number of open pages. Ctrl-C and SIGTERM end
it cleanly (status 0): every page's stream closes, and a fleet's ssh connections are ended.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from gpumon.cli.common import fleet_requested, load_settings, open_source
from gpumon.errors import EXIT_OK
from gpumon.settings import Settings
from gpumon.web.address import DEFAULT, is_loopback, parse_listen, url_host


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args)
    config = settings.config
    host, port = parse_listen(args.listen or config.serve_listen or DEFAULT)
    # aiohttp is loaded by `serve` alone (the other commands start without it).
    from gpumon.usage.report import PageReport
    from gpumon.usage.settings import history_settings
    from gpumon.web.auth import stored_token, token_from_file
    from gpumon.web.feed import Feed
    from gpumon.web.server import WebServer, tls_context

    tls = tls_context(config.serve_tls_cert, config.serve_tls_key)
    token, note = None, "this machine only"
    if not is_loopback(host):
        if config.serve_token_file:
            token = token_from_file(Path(config.serve_token_file))
            note = f"the token is in {config.serve_token_file}"
        else:
            token, made = stored_token()
            note = "the token is kept for the next start; it is printed this once" if made else None
    feed = Feed()
    cards, backend = _cards(args, settings, feed)
    # "Last 7 days": this machine's usage ledger, shown with this machine's cards only (not beside a
    # fleet's, the demo's or a replay's).
    own = backend is not None and not (args.demo or args.scenario is not None or args.replay)
    report = PageReport(history_settings(config.history)) if own else None
    server = WebServer(cards, feed, host, port, token, tls, report=report)

    def announce(bound: int) -> None:
        from gpumon.web.auth import default_token_file

        base = f"{'https' if tls else 'http'}://{url_host(host)}:{bound}/"
        if token is not None and note is None:  # made before: not printed again
            line = f"{base} (the access token is in {default_token_file()}: add ?token=…, or send it as Bearer)"
        else:
            line = f"{base}?token={token} ({note})" if token is not None else f"{base} ({note})"
        print(f"gpumon serve: {line}", flush=True)

    try:
        return asyncio.run(_serve(cards, server, announce))
    finally:
        if backend is not None:
            backend.close()


def _cards(args: argparse.Namespace, settings: Settings, feed):
    """(LocalCards or FleetCards, this machine's backend to close or None)."""
    from gpumon.web.feed import FleetCards, LocalCards

    config = settings.config
    one_machine = args.local or args.demo or args.scenario is not None or args.replay
    if fleet_requested(args) or ((config.fleet_hosts or config.fleet_prometheus_url) and not one_machine):
        from gpumon.cli.fleet import build, host_list, prometheus_url

        fleet = build(args, settings, host_list(args, config, use_config=True), prometheus_url(args, config, True))
        return FleetCards(fleet, feed), None
    from gpumon.cards.sampler import Sampler

    backend = open_source(args, settings.health)  # no driver: said now (status 3), before anything is bound
    sampler = Sampler(backend, interval=args.interval, enrich=True, owners=settings.host_paths)
    return LocalCards(sampler, feed, settings.sharing), backend


async def _serve(cards, server, announce) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    announce(await server.start())
    reading = asyncio.create_task(cards.run())
    stopping = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        cards.stop()
        await server.stop()
        await reading  # a failure to read (the driver gone at start) is raised here
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    sys.stdout.flush()
    return EXIT_OK
