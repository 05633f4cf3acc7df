"""The host's queue of jobs waiting for cards, every user's (gpumon/sharing/queue.py), as a few
lines under J's job list: as the app last read the shared place (in a thread), shown as text (names and
user names are data, never markup); hidden while nobody waits."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gpumon.sharing import queue
from gpumon.tui.literal_text import plain

SHOWN = 5  # entries listed; the rest are counted


def queue_text(entries: list[queue.Entry]) -> Text:
    text = Text("Queue on this host", style="bold")
    text.append(f" ({len(entries)} waiting, first come first served)", style="dim")
    for entry in entries[:SHOWN]:
        text.append("\n")
        text.append_text(plain(entry.words()))
    if len(entries) > SHOWN:
        text.append(f"\n… {len(entries) - SHOWN} more (gpumon queue lists them all)", style="dim")
    return text


class HostQueue(Static):
    def __init__(self, **kwargs) -> None:
        super().__init__("", **kwargs)
        self.shown: tuple[str, ...] | None = None
        self.display = False  # until someone waits

    def on_mount(self) -> None:
        self.refresh_queue()
        self.set_interval(1.0, self.refresh_queue)

    def refresh_queue(self) -> None:
        self.app.refresh_sharing()  # read in a thread: shown here when it is back
        entries = self.app.sharing_now.latest.queue
        key = tuple(e.words() for e in entries)
        if key == self.shown:  # repaint only when it changed
            return
        self.shown = key
        self.display = bool(entries)
        self.update(queue_text(entries))
