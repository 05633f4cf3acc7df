"""Who may read the page: the access token, and the checks every request passes.

Bound to loopback, the page is open to this machine (where anyone can run gpumon anyway), but
only under a local name (Host: localhost, 127.0.0.1, [::1]): a web site that points its own name
at 127.0.0.1 (DNS rebinding) is refused. Bound beyond loopback, every request needs the token:
`?token=` (the page then gets it as an HttpOnly, SameSite=Strict cookie, so its event stream
carries it), `Authorization: Bearer`, or that cookie. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import os
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import platformdirs
from aiohttp import web

from gpumon.errors import UsageError

COOKIE = "gpumon_token"
MIN_TOKEN = 16
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def default_token_file() -> Path:
    return Path(platformdirs.user_state_dir("gpumon")) / "serve-token"


def token_from_file(path: Path) -> str:
    """The token a file holds (the config's [serve] token_file): one line, at least 16 characters."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the token file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if len(text) < MIN_TOKEN or not text.isascii() or not text.isprintable() or " " in text:
        raise UsageError(f"token file {path}: expected one word of at least {MIN_TOKEN} printable ASCII characters "
                         "(make one with: openssl rand -hex 32)")
    return text


def stored_token(path: Path | None = None) -> tuple[str, bool]:
    """The token kept in the state directory, made (0600) the first time: (token, made now)."""
    path = path or default_token_file()
    if path.exists():
        return token_from_file(path), False
    token = secrets.token_urlsafe(32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(token + "\n")
    except FileExistsError:  # another gpumon serve made it meanwhile: use theirs
        return token_from_file(path), False
    except OSError as exc:
        raise UsageError(f"cannot keep the access token in {path}: {exc.strerror or exc} "
                         "(name a token file in the config: [serve] token_file)") from None
    return token, True


def _plain(status: int, line: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=line + "\n", headers=headers)


def _host_name(header: str) -> str:
    """The name of a Host header, without its port."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


def guard(token: str | None, local_names: set[str], secure: bool):
    """The middleware: GET only; the token when `token` is set, else a local Host name (or one of
    `local_names`, the names it was bound as)."""
    expected = token.encode() if token is not None else b""
    local = _LOCAL_HOSTS | {n.lower() for n in local_names}

    def matches(given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode("utf-8", "replace"), expected)

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method != "GET":
            return _plain(405, "gpumon serve is read-only: GET only", Allow="GET")
        if token is None:
            host = request.headers.get("Host")
            if host is not None and _host_name(host).lower() not in local:
                return _plain(403, "gpumon serve answers to localhost only (it listens on loopback)")
            return await handler(request)
        if matches(request.query.get("token")):
            response = await handler(request)
            if request.path == "/":  # the page's event stream carries it from here on
                response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", secure=secure, path="/")
            return response
        bearer = request.headers.get("Authorization", "")
        if (bearer[:7].lower() == "bearer " and matches(bearer[7:].strip())) or matches(request.cookies.get(COOKIE)):
            return await handler(request)
        return _plain(401, "gpumon serve: the access token is missing or wrong: open the URL gpumon serve printed "
                           "(…/?token=…), or send Authorization: Bearer TOKEN", **{"WWW-Authenticate": "Bearer"})

    return check


SECURITY_HEADERS = {
    # The page loads nothing from elsewhere, runs only its own script, and may not be framed.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the token in the address never travels on
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


async def add_security_headers(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
