"""`--listen ADDR`: where the page is served, and whether that is beyond this machine."""

from __future__ import annotations

import ipaddress
import socket

from gpumon.errors import UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
_LOCAL_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT', ':PORT' or 'PORT' (loopback, as `watch --prometheus`), '[v6]:PORT'; port 0:
    any free port."""
    given = text.strip()
    host, sep, port = given.rpartition(":")
    if not sep:
        host, port = "", given
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise UsageError(f"bad --listen {text!r}: {host!r} in brackets is not an IPv6 address") from None
    elif ":" in host:
        raise UsageError(f"bad --listen {text!r}: write an IPv6 address in brackets, e.g. [::1]:{DEFAULT_PORT}")
    if any(c.isspace() or c in "/@?#" for c in host):
        raise UsageError(f"bad --listen {text!r}: expected HOST:PORT, :PORT or [IPv6]:PORT")
    try:
        number = int(port)
    except ValueError:
        raise UsageError(f"bad --listen {text!r}: expected HOST:PORT, :PORT or [IPv6]:PORT") from None
    if not 0 <= number < 65536:
        raise UsageError(f"bad --listen port {port}: must be 0-65535")
    return host or DEFAULT_HOST, number


def is_loopback(host: str) -> bool:
    """Only this machine can reach HOST: every address it names is a loopback one."""
    if host.lower() in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return False  # binding will say what is wrong with it
    return bool(found) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in found)


def url_host(host: str) -> str:
    """How a browser elsewhere names this machine: its name for a wildcard address."""
    if host in ("0.0.0.0", "::", ""):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host
