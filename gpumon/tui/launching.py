"""The run dialog's answers, launched on a host: one path for the single-machine TUI's `r` and a
fleet host's, so every box of the dialog reaches the host's `gpumon run` whichever view it was
typed in (the fleet's own copy of this once dropped Failover).

    launch(app, host, gpu.ref, choice, "GPU 0", interval=0.5, launched=rescan)

Detached, the host's gpumon starts the job in a background thread and its summary (job id, cards,
pid, log) comes back as a notification; Foreground runs it in this terminal (over `ssh -t` for a
fleet host), the TUI suspended until it ends, and says how it ended as the host recorded it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from textual.app import App

from gpumon.jobs import command_history
from gpumon.jobs.host import Host, HostError
from gpumon.jobs.launch import LaunchRequest, how_it_ended, run_in_terminal, shell_request
from gpumon.tui.background import in_background
from gpumon.tui.screens.run_dialog import RunChoice


def request_for(choice: RunChoice, gpu_ref: str, interval: float | None = None) -> LaunchRequest:
    """The command as typed, on this card, with every box of the dialog. `interval`: how often
    the job's supervisor samples its cards (None: the host's own default)."""
    return shell_request(choice.command, gpu_ref, mem_limit=choice.mem_limit, numa=choice.numa,
                         foreground=choice.foreground, wait=choice.wait, cwd=choice.cwd or None,
                         failover=choice.failover, interval=interval)


def launch(app: App, host: Host, gpu_ref: str, choice: RunChoice, card: str, *, interval: float | None = None,
           launched: Callable[[], Any] = lambda: None, note: Callable[[], str | None] = lambda: None) -> None:
    """Launch what the dialog says on `host`; `card` names the card in messages ("GPU 2", "h:2").
    `launched()` once the host has started it; `note()`: a line to add to its summary (read in the
    background thread)."""
    request = request_for(choice, gpu_ref, interval)
    command_history.remember_command(choice.command)  # the dialog's history is this machine's, whatever the host
    if choice.foreground:
        in_this_terminal(app, host, request, card)
        return
    app.notify(f"starting on {card}…", timeout=3)

    def start() -> str:
        said = host.launch(request)
        return "\n".join(line for line in (said, note()) if line)

    def done(output: str) -> None:
        app.notify(output, title=f"launched on {card}", timeout=10)
        launched()

    in_background(app, start, done,
                  lambda exc: app.notify(str(exc) or type(exc).__name__, title=f"not launched on {card}",
                                         severity="error", timeout=12))


def in_this_terminal(app: App, host: Host, request: LaunchRequest, card: str) -> None:
    """The dialog's Foreground: the TUI gives up the terminal until the job ends (Ctrl-C is the job's)."""
    before: set[str] = set()

    def run() -> int:
        before.update(_job_ids(host))
        try:
            return host.run_here(request, tty=True)
        except OSError as exc:
            print(f"gpumon: cannot run {host.name}'s gpumon: {exc.strerror or exc}")
            return 127

    def as_recorded(code: int) -> str:
        """As the host's records say: the child's exit status alone cannot tell a Ctrl-C from `exit 130`."""
        try:
            new = [job for job in host.jobs() if job["id"] not in before and job["command"] == request.command]
        except HostError:
            new = []
        return how_it_ended(new[-1] if new else None, code)

    with app.suspend():
        run_in_terminal(card, request.typed or " ".join(request.command), run, as_recorded)


def _job_ids(host: Host) -> set[str]:
    try:
        return {job["id"] for job in host.jobs()}
    except HostError:
        return set()
