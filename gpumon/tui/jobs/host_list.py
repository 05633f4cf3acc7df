"""What `J` lists and where it acts: one host here (this machine's J, or a fleet host's view),
every host of a fleet in tui/jobs/fleet_list.py (kept apart: a single-machine start loads no fleet
module). The screen (tui/jobs/screen.py) is the same for both; a job list says where the jobs come
from, how often to ask, where a job is stopped and how its log is followed.

`read()` blocks (a fleet host is asked over ssh): the screen calls it in a background thread.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumon.errors import GpumonError
from gpumon.remote.hosts import LOCAL
from gpumon.tui.jobs.log_tail import FileLog, HostLog

if TYPE_CHECKING:
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
        if self.host.name == LOCAL:  # this machine: its file, not a child gpumon following it
            return FileLog(job["log"])
        return HostLog(self.host, job["id"])
