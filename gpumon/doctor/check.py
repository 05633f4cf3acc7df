"""A check's verdict, and how verdicts become the exit status."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL = "ok", "warn", "fail"
EXIT = {OK: 0, WARN: 1, FAIL: 2}


@dataclass(frozen=True)
class Check:
    id: str  # stable: scripts and the docs name checks by it
    status: str  # ok, warn or fail
    summary: str  # what was found
    fix: str = ""  # what to do about it (empty when ok)

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "status": self.status, "summary": self.summary, "fix": self.fix}


def exit_status(checks: list[Check]) -> int:
    return max((EXIT[c.status] for c in checks), default=0)
