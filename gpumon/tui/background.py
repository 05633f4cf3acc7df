"""Blocking work (a command over ssh on a fleet host) off the event loop.

Each piece runs in a daemon thread of its own and hands its result, or the exception it raised,
back to the app's loop. Not Textual's thread workers: those run in the loop's executor, which the
app waits for when it exits, so one slow host could hold up `q` for as long as ssh waits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from textual.app import App

log = logging.getLogger(__name__)
T = TypeVar("T")


def in_background(app: App, work: Callable[[], T], done: Callable[[T], Any],
                  failed: Callable[[Exception], Any]) -> threading.Thread:
    """Run `work()` in a daemon thread; then `done(result)` or `failed(exception)` on the loop."""

    def deliver(callback: Callable[[Any], Any], value: Any) -> None:
        # A message to the app, not call_from_thread: an error in the callback is then the app's
        # (it ends with gpumon's message for bugs), not a traceback printed over the screen by
        # this thread while the app goes on.
        try:
            delivered = app.call_later(callback, value)
        except RuntimeError:  # its loop has closed
            delivered = False
        if not delivered:  # the app has ended meanwhile: nobody to tell
            log.debug("background result dropped: the app has ended")

    def target() -> None:
        try:
            result = work()
        except Exception as exc:  # noqa: BLE001 - handed to `failed`, on the loop
            deliver(failed, exc)
        else:
            deliver(done, result)

    thread = threading.Thread(target=target, name="gpumon-remote", daemon=True)
    thread.start()
    return thread
