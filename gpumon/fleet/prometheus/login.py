"""How gpumon logs in to a Prometheus server that demands basic auth, with no password on the
command line (where `ps` shows it to everyone on the machine).

The user: the URL's (http://user@host), else the config's `[fleet] prometheus_user`. The password:
the URL's (http://user:password@host, still accepted), else $GPUMON_PROMETHEUS_PASSWORD, else the
file named by `[fleet] prometheus_password_file` (its first line), else ~/.netrc as curl reads it:
the entry for the URL's host name, or `default`, when its login is the user or no user is given.
A password with no user is a usage error; so is a ~/.netrc entry others can read (as Python's
netrc module and ssh refuse such files).
"""

from __future__ import annotations

import netrc
import os
import stat
from pathlib import Path
from urllib.parse import urlsplit

from gpumon.errors import UsageError
from gpumon.fleet.prometheus.api import PASSWORD_ENV, Endpoint


def login(url: str, user: str | None = None, password_file: str | None = None) -> Endpoint:
    """The server at `url` (parse_url's) with its login, if any (see the module's doc)."""
    server = Endpoint.of(url)
    name = server.user or user or None
    password = server.password if server.password is not None else os.environ.get(PASSWORD_ENV) or None
    if password is None and password_file:
        password = _read_password(password_file)
    if password is None:
        entry = _netrc_entry(urlsplit(server.url).hostname or "")
        if entry is not None and (name is None or entry[0] == name):
            name, password = entry
    if password is not None and not name:
        source = "the URL" if server.password is not None else f"${PASSWORD_ENV}" if os.environ.get(PASSWORD_ENV) \
            else "[fleet] prometheus_password_file"
        raise UsageError(f"{source} gives a password for Prometheus but no user is given: name one in the URL "
                         "(http://user@host) or as [fleet] prometheus_user")
    return Endpoint(server.url, name, password)


def _read_password(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            password = file.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror.lower() if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise UsageError(f"cannot read [fleet] prometheus_password_file {path}: {why}") from None
    if not password:
        raise UsageError(f"[fleet] prometheus_password_file {path} is empty")
    return password


def _netrc_entry(host: str) -> tuple[str, str] | None:
    """(login, password) for `host` from ~/.netrc, or None when it has none."""
    path = Path.home() / ".netrc"
    try:
        # The file named: Python then skips its own permission check, made below only on a file
        # that will be used (a lax ~/.netrc for other hosts is no business of gpumon's).
        entries = netrc.netrc(str(path))
    except FileNotFoundError:
        return None
    except netrc.NetrcParseError as exc:  # its message may quote a misplaced password: the line alone
        raise UsageError(f"~/.netrc line {exc.lineno}: not in netrc's format") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read ~/.netrc: {getattr(exc, 'strerror', None) or exc}") from None
    found = entries.authenticators(host)
    if found is None or not found[2]:
        return None
    info = path.stat()
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError("~/.netrc has a password for Prometheus but others can read or own the file: "
                         "chmod 600 ~/.netrc")
    return found[0], found[2]
