"""A text field that takes keys in the order they were typed, however fast they come.

Textual hands each key to the focused widget's own queue as soon as it arrives, but a widget's
bindings run only when the key has bubbled back up to the app. An Input inserts a typed character
at once and leaves Backspace, Ctrl-U, arrows and Enter to its bindings; keys that arrive together
(a paste, a fast typist, keys bundled by ssh) are then applied out of order: `abc⌫d` ends as `abc`,
and Enter submits before the characters typed ahead of it are in. Tab moves the focus, also at the
app, after the characters behind it were given to the field it leaves.

`Field` runs its own bindings as each key's turn comes, moves the focus on Tab itself, and passes
keys that reach it after the focus has moved on to the widget that has it now.
"""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.widgets import Input

_ACTIONS = {binding.key: binding.action for binding in Binding.make_bindings(Input.BINDINGS)}
_FOCUS = {"tab": "focus_next", "shift+tab": "focus_previous"}


class Field(Input):
    async def _on_key(self, event: events.Key) -> None:
        focused = self.screen.focused
        if focused is not self and focused is not None:  # a Tab before this key moved the focus on
            event.stop()
            event.prevent_default()
            focused._forward_event(events.Key(event.key, event.character))  # as the app gives keys
            return
        if event.key in _FOCUS:
            event.stop()
            event.prevent_default()
            getattr(self.screen, _FOCUS[event.key])()
            return
        action = _ACTIONS.get(event.key)
        if action is None:
            await super()._on_key(event)
            return
        event.stop()
        event.prevent_default()
        self._restart_blink()
        await self.run_action(action)
