"""The driver's health events other than XIDs, in words: what each says of the card, the verdict it
gives within the window, and what fixes it (NVML's nvmlEventType* of the same names, delivered by
the NVIDIA backend as they come; the XID each stands beside in NVIDIA's catalogue)."""

from __future__ import annotations

from collections.abc import Iterable

from gpumon.counters import HealthReason, recovery_action_name
from gpumon.units import format_time

# name -> (verdict, what happened, what fixes it)
EVENTS: dict[str, tuple[str, str, str]] = {
    "sbe_storm": ("warn", "a storm of single-bit ECC errors (the driver stopped counting them one by one)",
                  "watch its ECC counters; if storms come back, plan to have the card serviced (as XID 92)"),
    "dram_retirement": ("fail", "memory was retired (a row remapped or a page retired, as XID 63)",
                        "drain the card and reset it so the remap or retirement takes effect"),
    "dram_retirement_failure": ("fail", "memory could not be retired (as XID 64)",
                                "reset the card; if the failure repeats, the card needs service (RMA)"),
    "nonfatal_poison": ("warn", "contained poisoned memory: the programs that touched it were stopped (as XID 94)",
                        "restart those programs; reset the card when it is free"),
    "fatal_poison": ("fail", "uncontained poisoned memory: every program on the card is affected (as XID 95)",
                     "reset the card (nvidia-smi -r) once its jobs are drained"),
    "gpu_unavailable": ("fail", "the driver made the card unavailable",
                        "reset the card or reboot; if it happens again, the card needs service (RMA)"),
    "recovery_action": ("fail", "the driver announced recovery action {action}", "{action_words}"),
}


def event_reasons(events: Iterable[tuple[str, int, float]], now: float, window_s: float,
                  recovery_words: dict[str, str]) -> list[tuple[HealthReason, str]]:
    """(reason, verdict) of each event (name, data, unix time) within the window, newest first."""
    out = []
    for name, data, when in events:
        if now - when >= window_s or name not in EVENTS:
            continue
        verdict, text, action = EVENTS[name]
        if name == "recovery_action":
            action_name = recovery_action_name(data)
            if action_name == "none":
                continue
            text = text.format(action=action_name)
            action = recovery_words.get(action_name, "see NVIDIA's error-recovery guide for this driver")
        stamp = format_time(when, now=now, seconds=True)
        out.append((HealthReason(f"event_{name}", f"{text} at {stamp}", action), verdict))
    return out
