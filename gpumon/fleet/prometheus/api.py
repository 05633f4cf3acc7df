"""Prometheus' HTTP API, as gpumon reads it: one instant query (`GET /api/v1/query`) at a time,
blocking (callers run it in a daemon thread), bounded in time (REQUEST_TIMEOUT_S for the whole
answer, not per read) and in size, asking for gzip. An `Endpoint` is the server and its basic-auth
login (prometheus_login finds the password); the login goes to that server alone, never to
another one it redirects to, and no message shows the password (`redact`). Every failure is an
ApiError that says why in words: connection refused, name not resolved, timeout, an HTTP status
with Prometheus' own reason, an answer that is not Prometheus' JSON.
"""

from __future__ import annotations

import base64
import errno
import gzip
import http.client
import io
import json
import re
import socket
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlencode, urlsplit, urlunsplit

from gpumon import __version__
from gpumon.errors import UsageError
from gpumon.sanitize import printable

REQUEST_TIMEOUT_S = 10.0
PASSWORD_ENV = "GPUMON_PROMETHEUS_PASSWORD"
MAX_ANSWER = 256 << 20  # 256 hosts x 8 cards answer about 5 MB
MAX_SERIES = 1_000_000

Series = tuple[dict[str, Any], float]  # (labels, value)


class ApiError(Exception):
    """Prometheus could not be read; the message says why, in words."""


# user:password@ in a URL (everything up to the last @ of the word: a password may hold one).
_CREDENTIALS = re.compile(r"(//|^|(?<=[\s'\"(]))([^\s:@/'\"]*):(?!//)\S*@")


def redact(text: str, password: str | None = None) -> str:
    """`text` fit for a message or a log: user:***@ for user:password@ in any URL, and `password`
    nowhere (a server may quote what it was sent)."""
    text = _CREDENTIALS.sub(lambda m: f"{m.group(1)}{m.group(2)}:***@", text)
    return text.replace(password, "***") if password else text


@dataclass(frozen=True)
class Endpoint:
    """A Prometheus server: its base URL, without credentials, and the basic-auth login for it."""

    url: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def of(cls, url: str) -> Endpoint:
        """http://user:password@host -> the server and that login."""
        parts = urlsplit(url)
        bare = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, ""))
        user = None if parts.username is None else unquote(parts.username)
        password = None if parts.password is None else unquote(parts.password)
        return cls(bare, user, password)


def parse_url(text: str) -> str:
    """`--prometheus-url`: the server's base URL (http[s]://[user[:password]@]host[:port][/prefix]),
    checked; the login stays in it (Endpoint.of takes it out)."""
    bad = UsageError(f"bad --prometheus-url {redact(printable(text)[:200])!r}: expected the Prometheus server's "
                     "address, e.g. http://prometheus:9090")
    try:
        url = urlsplit(text.strip())
        url.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise bad from None
    if url.scheme not in ("http", "https") or not url.hostname or url.query or url.fragment:
        raise bad
    path = url.path.rstrip("/")
    for suffix in ("/api/v1/query", "/graph"):  # pasted from a browser or an API call
        path = path.removesuffix(suffix)
    return urlunsplit((url.scheme, url.netloc, path, "", ""))


def _words(exc: BaseException, timeout: float) -> str:
    """A failed request, for people."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) and not isinstance(exc, urllib.error.HTTPError) \
        else exc
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"timeout (no answer in {timeout:g} s)"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "name not resolved"
    if isinstance(reason, ssl.SSLError):
        return f"TLS: {getattr(reason, 'reason', None) or reason}"
    if isinstance(reason, (ConnectionResetError, http.client.RemoteDisconnected)):
        return "connection closed without an answer"
    if isinstance(reason, http.client.HTTPException):
        return "answered with something that is not HTTP"
    if isinstance(reason, OSError) and reason.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return "no route to host"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason) or type(reason).__name__


def _read_body(response: Any, deadline: float, timeout: float) -> bytes:
    data = bytearray()
    while chunk := response.read(1 << 16):
        data += chunk
        if len(data) > MAX_ANSWER:
            raise ApiError(f"answered with over {MAX_ANSWER >> 20} MiB")
        if time.monotonic() > deadline:
            raise ApiError(f"timeout (the answer took over {timeout:g} s)")
    if response.headers.get("Content-Encoding") == "gzip":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(bytes(data))) as unzipped:
                data = bytearray(unzipped.read(MAX_ANSWER + 1))
        except (OSError, EOFError):
            raise ApiError("answered with a broken gzip body") from None
        if len(data) > MAX_ANSWER:
            raise ApiError(f"answered with over {MAX_ANSWER >> 20} MiB")
    return bytes(data)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port or {"http": 80, "https": 443}.get(parts.scheme)


class _LoginStaysHome(urllib.request.HTTPRedirectHandler):
    """Redirects keep the login only to the same scheme, host and port (as curl does without
    --location-trusted). urllib itself would copy a Request's Authorization header to any host;
    it is an "unredirected" header here, which urllib never copies, and is put back by this."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        login = req.unredirected_hdrs.get("Authorization")
        if new is not None and login is not None and _origin(new.full_url) == _origin(req.full_url):
            new.add_unredirected_header("Authorization", login)
        return new


_OPENER = urllib.request.build_opener(_LoginStaysHome)


def _request(server: Endpoint, url: str) -> urllib.request.Request:
    headers = {"Accept": "application/json", "Accept-Encoding": "gzip", "User-Agent": f"gpumon/{__version__}"}
    request = urllib.request.Request(url, headers=headers)
    if server.user is not None:  # basic auth, never in the URL
        secret = f"{server.user}:{server.password or ''}".encode()
        request.add_unredirected_header("Authorization", "Basic " + base64.b64encode(secret).decode())
    return request


def query(server: Endpoint | str, promql: str, timeout: float = REQUEST_TIMEOUT_S) \
        -> tuple[float | None, list[Series], int]:
    """One instant query (blocking) -> (Prometheus' time, [(labels, value)], bytes received).
    ApiError says why it failed, without the password."""
    server = Endpoint.of(server) if isinstance(server, str) else server
    try:
        return _query(server, promql, timeout)
    except ApiError as exc:
        raise ApiError(redact(str(exc), server.password)) from None


def query_range(server: Endpoint | str, promql: str, start: float, end: float, step: float,
                timeout: float = REQUEST_TIMEOUT_S) -> list[tuple[dict[str, Any], list[tuple[float, float]]]]:
    """One range query (`/api/v1/query_range`, blocking) -> [(labels, [(time, value)])]; ApiError
    as query()'s (the usage report's history of a cluster)."""
    server = Endpoint.of(server) if isinstance(server, str) else server
    params = {"query": promql, "start": repr(start), "end": repr(end), "step": repr(step)}
    try:
        doc = _get_json(server, f"{server.url}/api/v1/query_range?{urlencode(params, quote_via=quote)}", timeout)[0]
        return _matrix(doc)
    except ApiError as exc:
        raise ApiError(redact(str(exc), server.password)) from None


def _result(doc: Any, kind: str) -> list:
    """The `result` list of an API answer of this `resultType` ("vector", "matrix"); ApiError if the
    answer is not one (an error, another kind, not Prometheus', too many series)."""
    if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
        raise ApiError("answered with JSON that is not Prometheus' API: is this the Prometheus server's address?")
    if doc["status"] == "error":
        raise ApiError(f"query failed: {printable(str(doc.get('error')))[:200]}")
    data = doc.get("data")
    result = data.get("result") if isinstance(data, dict) else None
    if not isinstance(result, list) or data.get("resultType") != kind:
        raise ApiError("answered with an unexpected kind of result")
    if len(result) > MAX_SERIES:
        raise ApiError(f"answered with over {MAX_SERIES} series")
    return result


def _matrix(doc: Any) -> list[tuple[dict[str, Any], list[tuple[float, float]]]]:
    result = _result(doc, "matrix")
    out = []
    for item in result:
        try:
            labels = item["metric"]
            points = [(float(at), float(value)) for at, value in item["values"]]
        except (TypeError, ValueError, KeyError):
            continue
        if isinstance(labels, dict):
            out.append((labels, points))
    return out


def _query(server: Endpoint, promql: str, timeout: float) -> tuple[float | None, list[Series], int]:
    doc, size = _get_json(server, f"{server.url}/api/v1/query?{urlencode({'query': promql}, quote_via=quote)}",
                          timeout)
    return (*_vector(doc), size)


def _get_json(server: Endpoint, url: str, timeout: float) -> tuple[Any, int]:
    deadline = time.monotonic() + timeout
    request = _request(server, url)
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            body = _read_body(response, deadline, timeout)
    except urllib.error.HTTPError as exc:
        raise ApiError(_http_error(exc, server)) from None
    except ApiError:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise ApiError(_words(exc, timeout)) from None
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        raise ApiError("answered with something that is not JSON: is this the Prometheus server's address?") \
            from None
    return doc, len(body)


def _http_error(exc: urllib.error.HTTPError, server: Endpoint) -> str:
    try:  # Prometheus says what was wrong in a JSON body
        detail = json.loads(exc.read(1 << 16)).get("error")
    except Exception:  # noqa: BLE001 - any body at all: the status alone then
        detail = None
    if exc.code == 404 and not detail:
        return "HTTP 404: no Prometheus API here: is this the Prometheus server's address?"
    if exc.code in (401, 403) and server.user is None:
        return (f"HTTP {exc.code}: not allowed (it needs a login: the user in the URL, http://user@host, or "
                f"[fleet] prometheus_user; the password in ${PASSWORD_ENV}, [fleet] prometheus_password_file "
                "or ~/.netrc)")
    if exc.code in (401, 403):
        return f"HTTP {exc.code}: not allowed as user {printable(server.user)[:64]!r}" + (
            "" if server.password else f" (no password given: ${PASSWORD_ENV}, [fleet] prometheus_password_file "
            "or ~/.netrc)")
    return f"HTTP {exc.code}" + (f": {printable(str(detail))[:200]}" if detail else f" {exc.reason}")


def _vector(doc: Any) -> tuple[float | None, list[Series]]:
    result = _result(doc, "vector")
    series: list[Series] = []
    when = None
    for item in result:
        try:
            labels, (at, value) = item["metric"], item["value"]
            number = float(value)
        except (TypeError, ValueError, KeyError):
            continue
        if isinstance(labels, dict) and isinstance(at, (int, float)):
            series.append((labels, number))
            when = float(at)
    return when, series
