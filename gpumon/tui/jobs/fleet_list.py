"""`J` with many hosts: the job list of every host of a fleet, for the J screen (tui/jobs/screen.py;
the one-host list is tui/jobs/host_list.py).
"""

from __future__ import annotations

from gpumon.fleet import Fleet
from gpumon.jobs.host import Host, host_for, jobs_of
from gpumon.tui.host_can_act import why_not_here
from gpumon.tui.jobs.host_list import Listing
from gpumon.tui.jobs.log_tail import HostLog


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
