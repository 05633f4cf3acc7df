"""The exporter's HTTP server (`--prometheus ADDR`): prometheus_client's WSGI app in a thread of its
own, behind TLS and basic auth where `--web-config-file` asks for them (exporter/web_config.py).

A TLS handshake runs in the connection's own thread (not in the accepting one, where a client that
never finishes it would hold up every scrape). A password is checked with bcrypt once per user and
password while they stay the same (bcrypt costs ~50 ms by design, every scrape would pay it); an
unknown user is checked against a hash too, so the time taken does not say which users exist.
Checks run a few at a time: a flood of wrong passwords queues for them (and is refused once it has
waited a while) instead of taking every core from the scrapes whose login is already known. A
password over bcrypt's 72 bytes matches no hash anyone can make: refused without a check.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.registry import Collector

from gpumon.errors import UsageError
from gpumon.exporter.collector import parse_listen_address, registry_for
from gpumon.exporter.web_config import WebConfig

log = logging.getLogger(__name__)
# A hash of a password nobody has, checked for unknown users (cost 10, as htpasswd -B makes them).
_NOBODY = b"$2b$10$yHnUa6UmrbXNmMmIQtWL3u4xpZtfu6xAbsUZTqqFlCvh5mFY9JuPa"
_REMEMBERED = 64  # user/password pairs that passed, kept so a scrape does not pay bcrypt each time
_CHECKS_AT_ONCE = 2  # bcrypt checks running together, whatever the number of requests
_CHECK_WAIT_S = 5.0  # a request that waits longer than this for a check is refused unchecked
_BCRYPT_MAX = 72  # bytes of a password bcrypt takes; more raises in bcrypt >= 4.1

App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    tls = None  # ssl.SSLContext: each accepted connection is wrapped in its own thread

    def finish_request(self, request, client_address) -> None:
        if self.tls is not None:
            try:
                request = self.tls.wrap_socket(request, server_side=True)
            except OSError:  # plain HTTP, or a client that gave up: nothing to answer over
                return
        super().finish_request(request, client_address)


class BasicAuth:
    """The WSGI app behind `basic_auth_users`: 401 without a known user and password."""

    def __init__(self, app: App, users: dict[str, bytes]) -> None:
        self.app = app
        self.users = users
        self._passed: dict[tuple[str, bytes], None] = {}
        self._lock = threading.Lock()
        self._checks = threading.BoundedSemaphore(_CHECKS_AT_ONCE)

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if self._allowed(environ.get("HTTP_AUTHORIZATION", "")):
            return self.app(environ, start_response)
        start_response("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                            ("WWW-Authenticate", 'Basic realm="gpumon"')])
        return [b"Unauthorized\n"]

    def _allowed(self, header: str) -> bool:
        import bcrypt

        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        hashed = self.users.get(user)
        secret = password.encode()
        if len(secret) > _BCRYPT_MAX:
            return False
        key = (user, hashlib.sha256(secret + (hashed or b"")).digest())
        with self._lock:
            if hashed is not None and key in self._passed:
                return True
        if not self._checks.acquire(timeout=_CHECK_WAIT_S):
            return False
        try:
            ok = bcrypt.checkpw(secret, hashed or _NOBODY) and hashed is not None
        except ValueError:  # a hash bcrypt cannot read after all: nobody gets in with it
            ok = False
        finally:
            self._checks.release()
        if ok:
            with self._lock:
                if len(self._passed) >= _REMEMBERED:
                    self._passed.pop(next(iter(self._passed)))
                self._passed[key] = None
        return ok


def serve(address: str, collector: Collector, web: WebConfig | None = None) -> WSGIServer:
    """The exporter on ADDRESS (`--prometheus`), in a thread of its own; returns the server (its
    `shutdown()` stops it)."""
    host, port = parse_listen_address(address)
    app: App = make_wsgi_app(registry_for(collector))
    if web is not None and web.users:
        app = BasicAuth(app, web.users)

    class Server(_Server):
        pass

    try:
        Server.address_family, bind = _family(host, port)
        httpd = make_server(bind, port, app, Server, handler_class=_Quiet)
    except OSError as exc:
        raise UsageError(f"cannot serve Prometheus metrics on {host}:{port}: {exc.strerror or exc}") from None
    httpd.tls = web.tls() if web is not None else None  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, name="prometheus-exporter", daemon=True).start()
    scheme = "https" if httpd.tls is not None else "http"  # type: ignore[attr-defined]
    log.info("serving Prometheus metrics on %s://%s:%d/metrics", scheme, host, port)
    return httpd


def _family(host: str, port: int) -> tuple[socket.AddressFamily, str]:
    """The address family to bind HOST with (an IPv6 address needs AF_INET6)."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    return family, sockaddr[0]
