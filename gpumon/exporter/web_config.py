"""`--web-config-file FILE`: TLS and basic auth for the exporter, in the Prometheus exporter-toolkit's
web configuration format, as node_exporter and dcgm-exporter read it (`--web.config.file`):

    tls_server_config:
      cert_file: server.crt      # relative paths are from the file's own folder
      key_file: server.key
    basic_auth_users:
      alice: $2y$10$...          # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')

Either part may be left out (TLS alone, or basic auth over plain HTTP). The toolkit's other keys
(client certificates, TLS versions and ciphers, HTTP headers, rate limits) are refused by name
rather than ignored: a file that asks for more than gpumon does must not seem to get it. The file
is read once, at start; anything wrong in it is one line and exit status 2.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.errors import UsageError

_TOP = ("tls_server_config", "basic_auth_users")
_TLS = ("cert_file", "key_file")
_BCRYPT = ("$2a$", "$2b$", "$2y$")


@dataclass(frozen=True)
class WebConfig:
    path: str
    cert_file: str | None = None
    key_file: str | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash

    def tls(self) -> ssl.SSLContext | None:
        """The server's TLS context (TLS 1.2 at least, as the toolkit's default), None without TLS."""
        if self.cert_file is None or self.key_file is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
            raise UsageError(f"bad --web-config-file {self.path}: cannot load cert_file {self.cert_file} with "
                             f"key_file {self.key_file}: {reason}") from None
        return context


def load_web_config(path: str) -> WebConfig:
    import yaml

    def bad(why: str) -> UsageError:
        return UsageError(f"bad --web-config-file {path}: {why}")

    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise bad(getattr(exc, "strerror", None) or str(exc)) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise bad(f"not YAML{where}: {getattr(exc, 'problem', None) or exc}") from None
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise bad("expected a mapping of tls_server_config and basic_auth_users")
    for key in doc:
        if key not in _TOP:
            raise bad(f"{key!r} is not supported (gpumon reads {', '.join(_TOP)})")
    folder = Path(path).parent
    cert = key = None
    tls = doc.get("tls_server_config")
    if tls is not None:
        if not isinstance(tls, dict):
            raise bad("tls_server_config: expected cert_file and key_file")
        for name in tls:
            if name not in _TLS:
                raise bad(f"tls_server_config: {name!r} is not supported (gpumon reads cert_file and key_file)")
        for name in _TLS:
            if not isinstance(tls.get(name), str) or not tls[name]:
                raise bad(f"tls_server_config: {name} is missing")
        cert, key = (str(folder / tls["cert_file"]), str(folder / tls["key_file"]))
    users = _users(doc.get("basic_auth_users"), bad)
    config = WebConfig(path, cert, key, users)
    config.tls()  # a missing or unreadable certificate is said now, not at the first scrape
    return config


def _users(found: object, bad) -> dict[str, bytes]:
    import bcrypt

    if found is None:
        return {}
    if not isinstance(found, dict):
        raise bad("basic_auth_users: expected user: bcrypt hash lines")
    users: dict[str, bytes] = {}
    for user, hashed in found.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise bad(f"basic_auth_users: bad user name {user!r}")
        if not isinstance(hashed, str) or not hashed.startswith(_BCRYPT):
            raise bad(f"basic_auth_users: {user}'s password is not a bcrypt hash (expected $2y$..., "
                      "e.g. from htpasswd -nBC 10)")
        try:
            bcrypt.checkpw(b"", hashed.encode())
        except ValueError:
            raise bad(f"basic_auth_users: {user}'s password is not a valid bcrypt hash") from None
        users[user] = hashed.encode()
    return users
