"""What `J` lists and where it acts: one host (this machine's J, or a fleet host's view) or every
host of a fleet. The screen (screens/jobs.py) is the same for both; these say where the jobs come
from, how often to ask, where a job is stopped and how its log is followed.

`read()` blocks (a fleet host is asked over ssh): the screen calls it in a background thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumon.errors import GpumonError
from gpumon.jobs.host import LocalHost, host_for, jobs_of
from gpumon.tui.host_reach import why_not_here
from gpumon.tui.job_logs import FileLog, HostLog

if TYPE_CHECKING:
    from gpumon.fleet import Fleet
    from gpumon.jobs.host import Host

Listing = tuple[list[dict[str, Any]] | None, list[str]]  # newest first (None: keep what is shown); why not


class HostJobs:
    """The jobs of one host, read every second (this machine's are read in this process)."""

    title = "Jobs"
    hosts_column = False
    refresh_s = 1.0
    none = "No jobs yet: select a card and press r."

    def __init__(self, host: Host) -> None:
        self.host = host

    def read(self) -> Listing:
        try:
            return list(reversed(self.host.jobs())), []
        except GpumonError as exc:  # the host could not say (HostError): what is shown stays
            return None, [str(exc)]

    def host_of(self, job: dict) -> Host:
        return self.host

    def log_of(self, job: dict) -> FileLog | HostLog:
        if isinstance(self.host, LocalHost):
            return FileLog(job["log"])
        return HostLog(self.host, job["id"])


class FleetJobs:
    """The jobs of every host that can say, asked all at once, every few seconds (less often for
    big fleets: each read starts gpumon on the host). Hosts that cannot answer now (away, or
    without gpumon) are named, not waited for."""

    title = "Jobs on every host"
    hosts_column = True
    none = "No jobs on the hosts that answered: select a card and press r."

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.refresh_s = max(5.0, len(fleet.names) / 8)

    def read(self) -> Listing:
        asked, away = [], []
        for status in self.fleet.statuses():
            problem = why_not_here(status, "listing jobs")
            if problem:
                away.append(problem)
            elif status.state not in ("live", "stale"):
                away.append(f"{status.host}: {status.state}" + (f" ({status.error})" if status.error else ""))
            else:
                asked.append(status.host)
        rows, errors = jobs_of([host_for(self.fleet, name) for name in asked])
        rows.sort(key=lambda job: job["id"], reverse=True)  # ids begin with their date and time
        return rows, away + [str(error) for error in errors]

    def host_of(self, job: dict) -> Host:
        return host_for(self.fleet, job["host"])

    def log_of(self, job: dict) -> HostLog:
        return HostLog(self.host_of(job), job["id"])
