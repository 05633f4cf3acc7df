"""What the fleet TUI does on a host: launch a command on one of its cards (the same run dialog,
and the same launch, tui/launching.py, as on one machine) and signal one of its processes. Both go
through the host interface (jobs/host.py `host_for(fleet, HOST)`: that host's own gpumon), which
pins, limits and supervises the job there and applies its own checks to signals (own processes
only, the same start time). The calls block, so they run in a background thread; the result comes
back as a notification naming the card as HOST:INDEX.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import App

from gpumon.fleet import Fleet
from gpumon.jobs import command_history
from gpumon.jobs import processes as actions
from gpumon.jobs.host import host_for
from gpumon.jobs.launch import card_limits
from gpumon.model import GpuSample, HostStatus, ProcessSample
from gpumon.tui.host_can_act import why_not_here
from gpumon.tui.launching import launch
from gpumon.tui.screens.card_actions import confirm_signal
from gpumon.tui.screens.run_dialog import RunDialog, simulated_note


def where(status: HostStatus, gpu: GpuSample) -> str:
    """The card as the fleet names it: HOST:INDEX (and the slice, for a MIG slice)."""
    slice_ = f" slice {gpu.uuid[:12]}…" if gpu.uuid and gpu.uuid.startswith("MIG-") else ""
    return status.card_id(gpu.index) + slice_


def ask_and_launch(app: App, fleet: Fleet, host: str, gpu: GpuSample, launch_cwd: str, why: str = "",
                   launched: Callable[[], Any] = lambda: None) -> None:
    """The run dialog for this card of this host; launches there when the user says so. `why`:
    how the card was chosen, shown in the dialog's title; `launched()` once the host has started it."""
    status = fleet.status(host)
    problem = why_not_here(status)
    if problem:
        app.notify(problem, severity="warning", timeout=6)
        return
    if gpu.state != "ok" or gpu.ref is None:
        app.notify(f"{status.card_id(gpu.index)} is {gpu.state}: select a working card", severity="warning")
        return
    local = fleet.specs[host].is_local
    card = where(status, gpu)
    simulated = local and not getattr(app, "local_real_pids", True)  # `local` in --demo
    dialog = RunDialog(gpu, command_history.command_history(), card_limits().get(gpu.ref), launch_cwd if local else "",
                       where=card + (f" ({why})" if why else ""), remote=not local,
                       note=simulated_note(gpu) if simulated else "")
    app.push_screen(dialog, lambda choice: launch(app, host_for(fleet, host), gpu.ref, choice, card,
                                                  launched=launched) if choice else None)


def ask_and_signal(app: App, fleet: Fleet, host: str, process: ProcessSample, kind: str) -> None:
    """Confirm, then signal the process through the host's gpumon, as on one machine."""
    status = fleet.status(host)
    problem = why_not_here(status, "signalling a process")
    if problem:
        app.notify(problem, severity="warning", timeout=6)
        return
    if fleet.specs[host].is_local and process.uid is not None and not actions.may_signal(process.uid):
        app.notify(f"not permitted: process {process.pid} belongs to {process.user}", severity="error")
        return
    confirm_signal(app, host_for(fleet, host), process, kind, on=host)
