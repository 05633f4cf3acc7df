"""How readings reach the screens: the app posts a message to each screen that shows them, and the
screen draws the newest (or, hidden, keeps it and draws it when shown again). The app never
writes a screen's attributes.

A screen busy for a while (a slow terminal, a long layout) finds several readings waiting in its
queue; `can_replace` collapses them into the newest, so it draws once, with the latest, as
Toolong does with its watcher's messages.
"""

from __future__ import annotations

from collections.abc import Mapping

from textual.message import Message

from gpumon.model import HostStatus, Snapshot


class SnapshotArrived(Message, bubble=False):
    """A reading of the cards shown, with the rules firing on them then (card index -> texts).

    What every reading must feed (the process history, the alert engine, the holders) the app
    has fed before posting: a reading collapsed into a newer one loses nothing but its drawing."""

    def __init__(self, snapshot: Snapshot, alerts: Mapping[int, tuple[str, ...]] | None = None) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.alerts = alerts if alerts is not None else {}

    def can_replace(self, message: Message) -> bool:
        # Textual asks the older message whether the newer one (`message`) may take its place.
        return isinstance(message, SnapshotArrived)


class HostsReported(Message, bubble=False):
    """The hosts of a fleet that reported since the last such message, each with its latest status."""

    def __init__(self, statuses: Mapping[str, HostStatus]) -> None:
        super().__init__()
        self.statuses = dict(statuses)

    def can_replace(self, message: Message) -> bool:
        # Hosts differ from one message to the next: the newer takes over the older's hosts, its
        # own statuses winning, so a collapsed backlog still names every host that changed.
        if not isinstance(message, HostsReported):
            return False
        message.statuses = {**self.statuses, **message.statuses}
        return True
