"""XID errors: NVIDIA's catalogue of the codes after which a card cannot be trusted (with what
fixes each), and the recent XIDs of each card, in words, for its panel. The events themselves
come from the card backends (cards/xid_events.py).
"""

from __future__ import annotations

from collections import deque

RECENT_S = 3600.0  # a panel shows a card's XIDs of the last hour
KEEP = 3  # … at most this many, newest first

# XIDs after which the card cannot be trusted until it is reset (NVIDIA's XID catalogue,
# docs.nvidia.com/deploy/xid-errors): the programs on it have lost their context or their memory
# may be corrupt. Failover moves jobs off a card that reports one; the health verdict fails it.
FATAL_XIDS: dict[int, str] = {
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "fell off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
# What fixes each, after the catalogue's recommended actions.
XID_ACTIONS: dict[int, str] = {
    48: "drain the card and reset it (nvidia-smi -r); if it happens again, the card needs service (RMA)",
    63: "drain the card and reset it so the remap or retirement takes effect",
    64: "reset the card; if the failure repeats, the card needs service (RMA)",
    74: "check the NVLink bridge or baseboard, then reset the card; if it repeats, service (RMA)",
    79: "reset the card or reboot; check its power, cooling and seating; if it repeats, service (RMA)",
    92: "watch its ECC counters; if the rate stays high, the card needs service (RMA)",
    94: "restart the programs that used it; reset the card when it is free to remap the row",
    95: "reset the card (every program on it is affected)",
    119: "reset the card; if it repeats, update the driver and GPU firmware",
    120: "reset the card; if it repeats, update the driver and GPU firmware",
}


class RecentXids:
    """The last few XIDs of each card."""

    def __init__(self) -> None:
        self._seen: dict[int, deque[tuple[int, float]]] = {}

    def record(self, index: int, code: int, when: float) -> None:
        self._seen.setdefault(index, deque(maxlen=KEEP)).appendleft((code, when))

    def texts(self, index: int, now: float) -> tuple[str, ...]:
        """'XID 79 2m ago', newest first; nothing older than RECENT_S."""
        return tuple(f"XID {code} {_ago(now - when)}" for code, when in self._seen.get(index, ())
                     if now - when < RECENT_S)


def _ago(seconds: float) -> str:
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{seconds // 60:.0f}m ago"
    return f"{seconds // 3600:.0f}h ago"
