"""Why an action (launching, signals, listing jobs) cannot be done on a fleet host: it is read
from afar (nvidia-smi, Prometheus) or cannot act now. Shared by the fleet's actions and the job
list, which screens of both kinds import.
"""

from __future__ import annotations

from gpumon.model import HostStatus


def why_not_here(status: HostStatus, what: str = "launching") -> str | None:
    """Why `what` (launching, signals, jobs) cannot be done on this host, or None when it can."""
    if status.can_launch:
        return None
    if status.source == "nvidia-smi":
        return f"{status.host} is read through nvidia-smi: {what} needs gpumon installed there"
    if status.source == "prometheus":
        return f"{status.host} is read through Prometheus, which cannot reach the host: {what} is not possible"
    return f"{status.host}: {what} is not possible there"
