"""The routes and the server's life.

GET only (anything else: 405), nothing that acts: no launch, no signal, no setting.

    /              the page (assets/index.html: no data in it; the script fills it in)
    /app.js /style.css
    /events        Server-Sent Events: the page's document (web/view.py) once per sample
    /api/snapshot  `gpumon snapshot --json` (with hosts: `snapshot --hosts … --json`)
    /api/health    `gpumon health --json` (with hosts: its fleet document)
    /api/users     `gpumon users --json` (with hosts: its fleet document), watched since the server started
    /api/report    `gpumon report --json --since 7d` of this machine's usage ledger (gpumon/usage)
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from importlib import resources
from typing import Any, Protocol

from aiohttp import web

from gpumon.errors import UsageError
from gpumon.web.auth import add_security_headers, guard
from gpumon.web.feed import Feed

log = logging.getLogger(__name__)

ASSETS = {"/": ("index.html", "text/html"), "/app.js": ("app.js", "text/javascript"),
          "/style.css": ("style.css", "text/css")}
KEEPALIVE_S = 15.0  # a comment line when nothing new came: proxies keep the stream open
WRITE_TIMEOUT_S = 30.0  # a page that reads nothing for this long is dropped
MAX_STREAMS = 256  # open pages; more are told to come back later (503)
SHUTDOWN_S = 2.0
FIRST_READING_S = 5.0  # how long /api/* waits for the first reading before it says 503


class Cards(Protocol):
    """What the server reads (web/feed.py: LocalCards, FleetCards)."""

    fleet: bool

    def snapshot_document(self) -> dict[str, Any] | None: ...
    def health_document(self) -> dict[str, Any] | None: ...
    def users_document(self) -> dict[str, Any] | None: ...


def _asset(name: str) -> bytes:
    return (resources.files("gpumon.web") / "assets" / name).read_bytes()


def make_app(cards: Cards, feed: Feed, token: str | None, local_names: set[str], secure: bool,
             report: Callable[[], dict[str, Any]] | None = None) -> web.Application:
    app = web.Application(middlewares=[guard(token, local_names, secure)])
    app.on_response_prepare.append(add_security_headers)
    streams: set[web.StreamResponse] = set()

    def asset(name: str, content_type: str):
        body = _asset(name)

        async def handler(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type=content_type, charset="utf-8")

        return handler

    def document(read):
        async def handler(request: web.Request) -> web.Response:
            doc = read()
            if doc is None:  # just started: the first reading is a moment away
                await feed.wait(0, FIRST_READING_S)
                doc = read()
            if doc is None:
                return web.Response(status=503, text="gpumon serve: no reading yet, try again in a moment\n",
                                    headers={"Retry-After": "1"})
            return web.json_response(doc)

        return handler

    async def events(request: web.Request) -> web.StreamResponse:
        if len(streams) >= MAX_STREAMS:
            return web.Response(status=503, text=f"gpumon serve: {MAX_STREAMS} pages are open already\n",
                                headers={"Retry-After": "10"})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"})
        await response.prepare(request)
        streams.add(response)
        seen = 0
        try:
            await response.write(b"retry: 2000\n\n")
            while not feed.closed:
                seen, message = await feed.wait(seen, KEEPALIVE_S)
                if feed.closed:
                    break
                async with asyncio.timeout(WRITE_TIMEOUT_S):
                    await response.write(message or b": keepalive\n\n")
        except (ConnectionError, TimeoutError):  # the page went away, or stopped reading
            pass
        finally:
            streams.discard(response)
        return response

    for path, (name, content_type) in ASSETS.items():
        app.router.add_get(path, asset(name, content_type), allow_head=False)
    app.router.add_get("/events", events, allow_head=False)
    app.router.add_get("/api/snapshot", document(cards.snapshot_document), allow_head=False)
    app.router.add_get("/api/health", document(cards.health_document), allow_head=False)
    app.router.add_get("/api/users", document(cards.users_document), allow_head=False)
    if report is not None:
        async def usage(request: web.Request) -> web.Response:  # SQLite reads, in a thread
            return web.json_response(await asyncio.to_thread(report))

        app.router.add_get("/api/report", usage, allow_head=False)
    return app


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """HTTPS from the config's [serve] tls_cert and tls_key; a file that will not load is bad input."""
    if not cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except FileNotFoundError as exc:
        raise UsageError(f"[serve] tls_cert/tls_key: no such file: {exc.filename or cert}") from None
    except (OSError, ssl.SSLError, ValueError) as exc:
        why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"[serve] tls_cert/tls_key: cannot load {cert} with {key}: {why}") from None
    return context


class WebServer:
    """The page on HOST:PORT; start() binds (port 0: any free one), stop() ends every stream."""

    def __init__(self, cards: Cards, feed: Feed, host: str, port: int, token: str | None,
                 tls: ssl.SSLContext | None = None, report: Callable[[], dict[str, Any]] | None = None) -> None:
        self.feed = feed
        self.host, self.port = host, port
        self.tls = tls
        app = make_app(cards, feed, token, {host}, secure=tls is not None, report=report)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_S)

    async def start(self) -> int:
        """Binds, and returns the port; a port in use or an address not here is bad input."""
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.tls)
        try:
            await site.start()
        except (OSError, socket.gaierror) as exc:
            await self._runner.cleanup()
            shown = f"[{self.host}]" if ":" in self.host else self.host
            raise UsageError(f"cannot listen on {shown}:{self.port}: {exc.strerror or exc}") from None
        self.port = self._runner.addresses[0][1]
        return self.port

    async def stop(self) -> None:
        self.feed.close()
        await self._runner.cleanup()
