"""Import asyncio without OpenSSL where the command never speaks TLS through it.

asyncio imports the ssl module as it is imported itself, only to be ready for TLS connections, and
ssl loads OpenSSL: 4.4 MiB of resident memory, an eighth of `watch`'s. Only `gpumon serve` (its
HTTPS page) opens TLS through asyncio. The other commands reach TLS, if ever, through urllib (a
Prometheus over https), which imports ssl itself when it is first used: that import still works.
"""

from __future__ import annotations

import sys


def import_asyncio_without_tls() -> None:
    if "asyncio" in sys.modules or "ssl" in sys.modules:
        return  # too late to leave it out, or already paid for
    # None in sys.modules makes `import ssl` raise ImportError, which asyncio's modules take as a
    # Python built without ssl: they go on without TLS.
    sys.modules["ssl"] = None  # type: ignore[assignment]
    try:
        import asyncio  # noqa: F401
    finally:
        del sys.modules["ssl"]
