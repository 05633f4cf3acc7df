"""A job that gpumon supervises moved to other cards because its card failed: the record its
supervisor (jobs/) writes to the host's job event log and `watch` (alerting/) reads back. Beside
model.py, below both of them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FailoverEvent:
    """A job gpumon supervises moved to other cards because its card failed: written by the job's
    supervisor to the host's job event log, read by `watch` (an event line and the hooks)."""

    host: str
    job: str  # the job's id
    name: str
    from_gpus: tuple[int, ...]  # NVML indices of the cards it left
    from_uuids: tuple[str, ...]
    to_gpus: tuple[int, ...]  # ... and of the cards it runs on now
    to_uuids: tuple[str, ...]
    reason: str  # why it moved: "GPU 0 is lost (GPU is lost)", "XID 79 on GPU 0: fell off the bus"
    attempt: int  # the attempt that starts now (2 for the first move)
    time: float
    event: str = "failover"

    def to_dict(self) -> dict[str, Any]:
        return {"event": self.event, "host": self.host, "job": self.job, "name": self.name,
                "from": list(self.from_gpus), "to": list(self.to_gpus), "from_uuids": list(self.from_uuids),
                "to_uuids": list(self.to_uuids), "reason": self.reason, "attempt": self.attempt, "time": self.time}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FailoverEvent:
        """Raises ValueError (or TypeError) for anything that is not such an event."""
        if data.get("event") != "failover":
            raise ValueError("not a failover event")

        def ints(key: str) -> tuple[int, ...]:
            if not all(isinstance(i, int) and not isinstance(i, bool) for i in data[key]):
                raise ValueError(f"{key}: not card indices")
            return tuple(data[key])

        def strs(key: str) -> tuple[str, ...]:
            if not all(isinstance(s, str) for s in data[key]):
                raise ValueError(f"{key}: not UUIDs")
            return tuple(data[key])

        return cls(host=str(data["host"]), job=str(data["job"]), name=str(data["name"]), from_gpus=ints("from"),
                   from_uuids=strs("from_uuids"), to_gpus=ints("to"), to_uuids=strs("to_uuids"),
                   reason=str(data["reason"]), attempt=int(data["attempt"]), time=float(data["time"]))
