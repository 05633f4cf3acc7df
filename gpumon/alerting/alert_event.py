"""What a rule says when it fires or resolves: one `AlertEvent`, whatever the kind of rule (the
JSON line, the hook's environment and stdin are made from it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpumon.counters import HealthReason

if TYPE_CHECKING:
    from gpumon.owners.holders import Holder
    from gpumon.sharing.view import UseWithoutClaim


@dataclass(frozen=True)
class AlertEvent:
    event: str  # "firing" | "resolved"
    rule: str
    gpu: int | None  # None: about a whole host (unreachable)
    uuid: str | None
    metric: str
    value: float
    threshold: float
    time: float
    name: str = ""  # the card's name (from the driver); in hook environments, not in the JSON
    host: str | None = None  # the host of the card (the fleet's name for it, else the snapshot's)
    error: str | None = None  # unreachable: why
    reasons: tuple[HealthReason, ...] = ()  # a health rule: the card's verdict's reasons
    holder: Holder | None = None  # an idle rule: who holds the cards (gpu, uuid: its first card)
    use: UseWithoutClaim | None = None  # an unclaimed rule: the process, and whose card it is on

    def to_dict(self) -> dict[str, Any]:
        out = {"event": self.event, "rule": self.rule, "gpu": self.gpu, "uuid": self.uuid,
               "metric": self.metric, "value": self.value, "threshold": self.threshold, "time": self.time,
               "host": self.host}
        if self.error is not None:
            out["error"] = self.error
        if self.metric == "health":
            out["reasons"] = [r.to_dict() for r in self.reasons]
        if self.holder is not None:
            out["holder"] = {**self.holder.to_dict(), "host": self.host}
        if self.use is not None:
            out["process"] = {**self.use.to_dict(), "words": self.use.words()}
        return out
