"""`gpumon snapshot --json --stream`: what `--hosts` reads on every host over ssh.

One schema-1 document per line (compact JSON), one per sample, until stdin or stdout closes. Over
ssh, stdin is the connection: when it dies, or the reading side closes it, this ends at once,
whatever the sampling interval, and leaves nothing running (a driver call that hangs, opening it
included, is in a daemon thread). The driver is opened and read with the TUI's timeouts (a card
that hangs is marked stale, the others keep their interval); samples that are late as a whole are
not repeated: the reading side notices the silence.
XIDs are listened for meanwhile, so the cards' health verdicts count them, as locally.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading

from gpumon.cards.sampler import Sampler
from gpumon.cards.xid_events import XidListener
from gpumon.cli.common import load_settings, open_source
from gpumon.errors import EXIT_OK, UsageError
from gpumon.model import Snapshot
from gpumon.remote.connection import stdin_connection
from gpumon.sharing import view
from gpumon.sharing.folder import SharingSettings


def watch_stdin(loop: asyncio.AbstractEventLoop, on_end) -> None:
    """Call on_end when stdin reaches its end (whatever is sent on it is ignored)."""
    fd = stdin_connection()
    if fd is None:
        return

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


async def _stream(sampler: Sampler, sharing: SharingSettings) -> None:
    loop = asyncio.get_running_loop()
    out = sys.stdout.buffer

    shared = view.SharingNow(sharing)  # read in a thread, every 2 s at most: the place is everyone's

    def publish(snapshot: Snapshot) -> None:
        if snapshot.stale:
            return
        # Who claims or reserves each card, as `snapshot --json` says it: `select --hosts` must not
        # offer a card a launch here holds.
        doc = view.annotate(snapshot.to_dict(), shared.current(snapshot).cards)
        try:
            out.write(json.dumps(doc, separators=(",", ":")).encode() + b"\n")
            out.flush()
        except (BrokenPipeError, OSError):  # the reading side is gone
            sampler.stop()

    sampler.subscribe(publish)
    ended = asyncio.Event()
    watch_stdin(loop, ended.set)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(sig, ended.set)
    # The sampler opens the driver in a daemon thread, as the TUI does: an nvmlInit that hangs on
    # a sick machine leaves this listening for the end of its connection all the same.
    running = asyncio.ensure_future(_sample(sampler, loop))
    ending = asyncio.ensure_future(ended.wait())
    done, _ = await asyncio.wait({running, ending}, return_when=asyncio.FIRST_COMPLETED)
    ending.cancel()
    if running in done:
        running.result()  # why it could not read the cards (no driver there) is the host's answer
        return
    sampler.stop()
    running.cancel()  # it may still be waiting for the driver to open
    await asyncio.gather(running, return_exceptions=True)


async def _sample(sampler: Sampler, loop: asyncio.AbstractEventLoop) -> None:
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
    settings = load_settings(args)
    sampler = Sampler(None, interval=args.interval, history_seconds=0,
                      opener=lambda: open_source(args, settings.health), owners=settings.host_paths)
    try:
        asyncio.run(_stream(sampler, settings.sharing))
    finally:
        # Closing the driver could wait on a call that hangs: never let it keep this process alive.
        if sampler.backend is not None:
            closer = threading.Thread(target=sampler.backend.close, daemon=True)
            closer.start()
            closer.join(1.0)
        try:
            sys.stdout.close()
        except OSError:
            pass
    return EXIT_OK
