"""How one attempt of a job ended, and what its supervisor makes of it (jobs/supervision/supervisor.py): whether
a `--failover` job moves to other cards, and the state and reason the job's end record gets."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from gpumon.jobs.supervision.failover import Trouble


@dataclass(frozen=True)
class AttemptEnd:
    code: int  # the command's exit status; -N: ended by signal N
    stopped: str | None  # why gpumon stopped it, if it did
    trouble: Trouble | None  # a card of the job failed while it ran (or as it ended)

    def moves(self, failover: int, stop_requested: str | None) -> bool:
        """A `--failover` job moves when its card failed and it did not finish: gpumon stopped it
        for the failure, or it ended with an error. The user's stop and the memory limit stay final."""
        if not failover or self.trouble is None or stop_requested:
            return False
        return self.stopped == self.trouble.reason or (self.stopped is None and self.code != 0)

    def record(self, failover: int, why: str | None = None) -> tuple[str, str | None, int | None, int | None]:
        """The job's end as recorded: state, reason, exit code, signal number."""
        code, sig = (self.code, None) if self.code >= 0 else (None, -self.code)
        reason = why or self.stopped
        if reason is None and self.trouble is not None:
            moved = "" if failover else " (no --failover: it was not moved)"
            reason = f"{self.trouble.reason} while the job ran{moved}"
        elif reason is None and failover and self.code != 0:
            ended = f"exited with status {self.code}" if sig is None else f"was ended by {signal.Signals(sig).name}"
            reason = f"{ended} on a healthy card: not failed over (the program's error, not the card's)"
        return ("killed" if self.stopped or sig else "exited"), reason, code, sig
