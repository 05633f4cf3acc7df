"""Never draw faster than the link carries: stop and wait on the terminal's own answers.

Over SSH the program cannot see the link: sshd reads the pty at once and queues whatever the link
cannot carry yet, so a monitor that writes faster than the link shows the past, and a key takes as
long to show as the backlog takes to drain. But a terminal answers a cursor position report
(`ESC [ 6 n`) only after it has drawn everything sent before it: the reply's delay is the link's
lag. So each frame ends with that question, and the next frame waits for its answer; frames that
arrive meanwhile are merged into one (only the newest content of each cell goes out). On a fast
link the answer takes milliseconds and nothing changes; on a slow one the screen is never more
than one frame behind.

A terminal that never answers (rare: some serial consoles, a pipe) is detected: after a few
unanswered questions gpumon stops asking and draws as before.
"""

from __future__ import annotations

from collections import deque

PROBE = "\x1b[6n"  # DSR: report the cursor position
FIRST_WAIT_S = 1.0  # how long a frame waits for an answer before the terminal is known to answer
LOST_S = 10.0  # an answer this late is taken as lost (the next frame goes out anyway)
GIVE_UP = 3  # unanswered questions, with none ever answered, before the terminal is taken as mute


class Pacer:
    def __init__(self) -> None:
        self.outstanding: deque[float] = deque()  # when each unanswered question was sent
        self.answers = 0
        self.mute = False  # the terminal never answers: draw without waiting
        self.lag = 0.0  # seconds the last answer took: how far behind the screen was

    def may_draw(self, now: float) -> bool:
        """May a frame go out now? Not while the last one is still on its way."""
        if not self.outstanding or self.mute:
            return True
        waited = now - self.outstanding[-1]
        if self.answers:
            if waited < LOST_S:
                return False
            self.outstanding.clear()  # an answer went missing (a key typed into it, a detach)
            return True
        if waited < FIRST_WAIT_S:
            return False
        if len(self.outstanding) >= GIVE_UP:
            self.mute = True
            self.outstanding.clear()
        return True

    def probe(self, now: float) -> str:
        """The question to send after a frame (nothing when one is already on its way)."""
        if self.mute or (self.outstanding and self.answers):
            return ""
        self.outstanding.append(now)
        return PROBE

    def answered(self, now: float) -> bool:
        """A position report arrived; False when none was asked for (a key that looks like one)."""
        if not self.outstanding:
            return False
        sent = self.outstanding.popleft()
        self.outstanding.clear()  # older ones answered too: the terminal drew everything before
        self.lag = now - sent
        self.answers += 1
        self.mute = False
        return True

    def behind(self, now: float) -> float:
        """How far behind the screen is now: the last answer's delay, or longer while waiting."""
        if not self.answers or self.mute:  # no answer ever: nothing is known about the link
            return 0.0
        waiting = now - self.outstanding[0] if self.outstanding else 0.0
        return max(self.lag, waiting) if self.outstanding else self.lag
