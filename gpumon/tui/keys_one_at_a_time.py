"""Keys from the terminal handed on one at a time, each once the one before it has been handled.

Textual forwards a key to the widget that has the focus when the key arrives, and runs bindings
when the key has bubbled back up to the app. Keys that arrive together (a fast typist, a paste-like
burst over ssh) are then all forwarded before the first has acted: `/zqxw` reaches the process
table whole, where `q` quits and `x` asks to terminate a process; a key that bubbles back after a
dialog was pushed is checked against the dialog's bindings before the dialog is built; and an
Input's editing keys (Backspace, Enter: bindings) act after the characters typed behind them.

Here each key (and paste) waits for its turn: it is forwarded as Textual forwards it, and a marker
is posted right behind it to the same widget. The marker travels the same queues, so when it is back
at the app the key has run every handler and binding on its way (a screen it pushed is on the
stack, the focus it moved has moved). A screen that is not mounted yet is sent a marker first: it
handles it once it is built, and only then gets keys. A marker is lost only with the widget it was
sent to (removed on the way, a dialog closed by its key): the keys behind it wait until that is
seen (every CHECK_S), and never longer than TURN_TIMEOUT_S (a key whose handling takes that long).

Ctrl-C waits for no turn: it is how a user leaves when a key's handling is stuck.
"""

from __future__ import annotations

import time
from collections import deque

from textual import events
from textual.app import App, ScreenStackError
from textual.message import Message
from textual.timer import Timer
from textual.widget import Widget

CHECK_S = 0.1
TURN_TIMEOUT_S = 5.0
_SETTLING = -1  # the marker is back; what the key's handling left on the app's queue runs first


class KeyTurn(Message):
    """Behind a key on its way: back at the app, that key is done."""

    def __init__(self, turn: int) -> None:
        super().__init__()
        self.turn = turn


class KeysInTurn(App):
    """An App whose keys from the terminal are handled one after the other, in the order typed."""

    OUT_OF_TURN = frozenset({"ctrl+c"})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._held: deque[events.Key | events.Paste] = deque()
        self._turn = 0
        self._waiting: int | None = None  # the turn whose marker is on its way
        self._turn_timer: Timer | None = None

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, events.Key) and event.key in self.OUT_OF_TURN:
            await super().on_event(event)
            return
        if isinstance(event, (events.Key, events.Paste)) and not event.is_forwarded:
            self._held.append(event)
            await self._hand_on()
            return
        await super().on_event(event)

    async def _hand_on(self) -> None:
        while self._held and self._waiting is None:
            try:
                screen = self.screen
            except ScreenStackError:  # starting (or ending): no screen yet to hand a key to
                self.set_timer(CHECK_S, self._hand_on)
                return
            target = self.focused or screen
            if screen.is_mounted:
                await super().on_event(self._held.popleft())
            self._turn += 1
            self._waiting = self._turn
            target.post_message(KeyTurn(self._turn))
            self._turn_timer = self.set_interval(CHECK_S, lambda turn=self._turn, target=target, since=time.monotonic():
                                                 self._check_turn(turn, target, since))

    def on_key_turn(self, message: KeyTurn) -> None:
        message.stop()
        self._turn_done(message.turn)

    def _check_turn(self, turn: int, target: Widget, since: float) -> None:
        """Its marker lost with its widget (or the key's handling this slow): the next key's turn."""
        if not target.is_attached or time.monotonic() - since > TURN_TIMEOUT_S:
            self._turn_done(turn)

    def _turn_done(self, turn: int) -> None:
        if turn != self._waiting:
            return
        if self._turn_timer is not None:
            self._turn_timer.stop()
            self._turn_timer = None
        self._waiting = _SETTLING
        self.call_later(self._next_turn)  # behind what the key queued on the app (Widget.focus does)

    async def _next_turn(self) -> None:
        self._waiting = None
        await self._hand_on()
