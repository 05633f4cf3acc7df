"""Open the NVIDIA driver while the TUI is still starting, and read the card names at once.

Importing Textual takes ~0.5 s; nvmlInit and the cards' names take milliseconds (even when a
sample would be slow: names are read on each card's own lane). So the driver is opened in a
thread first thing, and the first frame, drawn before Textual, already lists the cards; the app
then gets the backend already open, or waits for it in its own thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

NAMES_WAIT_S = 0.2  # from the start: how long the first frame waits for the card names before it goes without


class EarlyOpen:
    def __init__(self, opener: Callable[[], Any]) -> None:
        self._opener = opener
        self._names_by = time.monotonic() + NAMES_WAIT_S
        self._backend: Any = None
        self._error: BaseException | None = None
        self._identity: Any = None
        self._opened = threading.Event()
        self._named = threading.Event()
        threading.Thread(target=self._open, name="gpumon-open", daemon=True).start()

    def _open(self) -> None:
        try:
            self._backend = self._opener()
        except BaseException as exc:  # noqa: BLE001 - raised again in whoever asks for the backend
            self._error = exc
            self._opened.set()
            self._named.set()
            return
        self._opened.set()
        try:
            self._identity = self._backend.identity(max(0.0, self._names_by - time.monotonic()))
        except Exception:  # noqa: BLE001 - names are a nicety: the first sample brings them anyway
            self._identity = None
        self._named.set()

    def identity(self) -> Any:
        """A Snapshot of the cards' names and ids (no values), if the driver gave them in time
        (cards that did not answer in time are listed as "stale")."""
        self._named.wait(max(0.0, self._names_by - time.monotonic()) + 0.05)
        return self._identity

    @property
    def failed(self) -> bool:
        return self._opened.is_set() and self._error is not None

    def backend(self) -> Any:
        """The opened backend, waiting for it (call from a thread: the driver may hang)."""
        self._opened.wait()
        if self._error is not None:
            raise self._error
        return self._backend
