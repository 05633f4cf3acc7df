"""`gpumon snapshot --json --stream`: what `--hosts` reads on every host over ssh.

One schema-1 document per line (compact JSON), one per sample, until stdin or stdout closes. Over
ssh, stdin is the connection: when it dies, or the reading side closes it, this ends at once,
whatever the sampling interval, and leaves nothing running (a driver call that hangs is in a
daemon thread). Samples that are late are not repeated: the reading side notices the silence.
XIDs are listened for meanwhile, so the cards' health verdicts count them, as locally.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import stat
import sys
import threading

from gpumon.cli.common import load_settings, open_source
from gpumon.errors import EXIT_OK, UsageError
from gpumon.model import Snapshot
from gpumon.monitor.sampler import Sampler
from gpumon.monitor.xid import XidListener


def stdin_is_a_connection() -> bool:
    """A pipe or socket (ssh, a parent process): its end means stop. A terminal or /dev/null: no."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (OSError, ValueError, AttributeError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def watch_stdin(loop: asyncio.AbstractEventLoop, on_end) -> None:
    """Call on_end when stdin reaches its end (whatever is sent on it is ignored)."""
    if not stdin_is_a_connection():
        return
    fd = sys.stdin.fileno()

    def readable() -> None:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            loop.remove_reader(fd)
            on_end()

    loop.add_reader(fd, readable)


async def _stream(sampler: Sampler) -> None:
    loop = asyncio.get_running_loop()
    out = sys.stdout.buffer

    def publish(snapshot: Snapshot) -> None:
        if snapshot.stale:
            return
        try:
            out.write(json.dumps(snapshot.to_dict(), separators=(",", ":")).encode() + b"\n")
            out.flush()
        except (BrokenPipeError, OSError):  # the reading side is gone
            sampler.stop()

    sampler.subscribe(publish)
    watch_stdin(loop, sampler.stop)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, sampler.stop)
    await sampler.open()
    # The backend counts each XID in its card's verdict as it hands it out: nothing to do with them here.
    listener = XidListener(sampler.backend, lambda index, code, when: None) \
        if XidListener.available(sampler.backend) else None
    if listener is not None:
        listener.start(loop)
    try:
        await sampler.run()
    finally:
        if listener is not None:
            listener.stop()


def run_stream(args: argparse.Namespace) -> int:
    if not args.json:
        raise UsageError("--stream prints JSON lines: use snapshot --json --stream")
    load_settings(args)
    backend = open_source(args)
    try:
        asyncio.run(_stream(Sampler(backend, interval=args.interval, history_seconds=0)))
    finally:
        # Closing the driver could wait on a call that hangs: never let it keep this process alive.
        closer = threading.Thread(target=backend.close, daemon=True)
        closer.start()
        closer.join(1.0)
        try:
            sys.stdout.close()
        except OSError:
            pass
    return EXIT_OK
