"""Who owns a GPU process: a Slurm job, a Kubernetes pod, a Docker or Podman container, a systemd
unit, or else its user (model.ProcessOwner, JSON "owner"; docs/design.md).

Read once per process (the enricher keeps it by pid and start time; again once a name asked in
the background has come, `unsettled`): its cgroup paths
(owners/cgroups.py) say which job, pod, container or unit it runs in, and the host's own records
(owners/records.py) give names to the ids. Where no Slurm cgroup exists (proctrack/linuxproc),
the job is the one `SLURM_JOB_ID` in the process's environment names. A card that a scheduler's prolog mapped to jobs
(`[owners] job_map_dir`) gives its processes that job when their cgroups name none. A card this
node's Slurm has given a job (its GRES, owners/slurm_gres.py) is that job's, processes or not.

Where the host's records are is configurable, as node_exporter's `--path.procfs` is: gpumon in a
container sees the host's /proc, /var/log/pods and engine state wherever they are mounted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpumon.model import GpuSample, ProcessOwner
from gpumon.owners.cgroups import parse_cgroup
from gpumon.owners.engines import ROOTLESS_NERDCTL, home_of, image_container, nerdctl_name, watching_ancestor
from gpumon.owners.records import (
    ContainerNames,
    JobMap,
    PodNames,
    SlurmArrays,
    owner_environment,
    slurm_from_environment,
    slurm_job_id,
)
from gpumon.owners.slurm_gres import SlurmGres

SHORT_ID = 12  # a container's id as its engine shows it


@dataclass(frozen=True, slots=True)
class HostPaths:
    """Where this host's records are (config [owners]; procfs: --path.procfs or [paths] procfs)."""

    procfs: Path = Path("/proc")
    pods_dir: Path = Path("/var/log/pods")
    docker_dir: Path = Path("/var/lib/docker")
    podman_dir: Path = Path("/var/lib/containers/storage")
    nerdctl_dir: Path = Path("/var/lib/nerdctl")
    job_map_dir: Path | None = None


class OwnerReader:
    def __init__(self, paths: HostPaths = HostPaths()) -> None:
        """`paths`: where this host's records are. (Never psutil's process-wide root: gpumon's own
        jobs and supervisors live in this /proc; the processes of the host's /proc are read
        through cards/procroot.)"""
        self.paths = paths
        self.pods = PodNames(self.paths.pods_dir)
        self.containers = ContainerNames(self.paths.docker_dir, self.paths.podman_dir)
        self.job_map = JobMap(self.paths.job_map_dir) if self.paths.job_map_dir is not None else None
        self.arrays = SlurmArrays()
        self.slurm_gres = SlurmGres()

    def read(self, pid: int, user: str | None) -> ProcessOwner:
        """The owner of a live process whose user is `user` (None: not known)."""
        try:
            text = (self.paths.procfs / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:  # gone, or hidden: what is known is the user
            text = ""
        facts = parse_cgroup(text)
        environment = owner_environment(self.paths.procfs, pid)
        if facts.slurm_job is not None:
            job, name = slurm_job_id(facts.slurm_job, facts.slurm_step, environment, self.arrays)
            return ProcessOwner("slurm", job, name, user)
        if facts.pod_uid is not None:
            return ProcessOwner("k8s", facts.pod_uid, self.pods.name(facts.pod_uid, facts.container_id), user)
        if facts.container_id is not None and facts.engine is not None:
            name = self.containers.name(facts.engine, facts.container_id)
            if name is None:  # a rootless engine's (systemd gave it a scope under its user's slice), or
                # an engine of its own storage (`podman --root DIR`): its conmon's argv has the name
                watcher = watching_ancestor(self.paths.procfs, pid)
                home = home_of(watcher.uid) if watcher is not None else None
                name = self.containers.name(facts.engine, facts.container_id, home) if home else None
                if name is None and watcher is not None and watcher.id == facts.container_id:
                    name = watcher.name
            return ProcessOwner("container", facts.container_id[:SHORT_ID], name, user, facts.engine)
        # Without Slurm's cgroup plugins (proctrack/linuxproc) the job is in the environment only.
        named = slurm_from_environment(environment)
        if named is not None:
            job, name = slurm_job_id(named[0], named[1], environment)
            return ProcessOwner("slurm", job, name, user)
        image = image_container(environment)
        if image is not None:
            return ProcessOwner("container", image[1], image[1], user, image[0])
        watched = self._watched(pid, user)
        if watched is not None:
            return watched
        if facts.unit is not None:
            return ProcessOwner("unit", facts.unit, None, user)
        return ProcessOwner("user", user or "?", None, user)

    def _watched(self, pid: int, user: str | None) -> ProcessOwner | None:
        """The container a conmon or containerd shim among the process's ancestors watches (no
        cgroup names it: a rootless engine's, or one told to make none)."""
        watcher = watching_ancestor(self.paths.procfs, pid)
        if watcher is None:
            return None
        home = home_of(watcher.uid)
        name = watcher.name
        if watcher.engine == "nerdctl" and watcher.namespace is not None:
            data_root = home / ROOTLESS_NERDCTL if home else self.paths.nerdctl_dir
            name = nerdctl_name(data_root, watcher.namespace, watcher.id, home)
        elif name is None:
            name = self.containers.name(watcher.engine, watcher.id, home)
        return ProcessOwner("container", watcher.id[:SHORT_ID], name, user, watcher.engine)

    @property
    def answers(self) -> int:
        """Grows whenever a name asked in the background arrives (SlurmArrays)."""
        return self.arrays.answers

    def unsettled(self, owner: ProcessOwner) -> bool:
        """Whether `owner` may read better once a name asked in the background arrives (an array
        task's `JOB_TASK`, asked of scontrol): read it again when `answers` has grown."""
        return owner.kind == "slurm" and self.arrays.asking(owner.id.partition(".")[0])

    def card_jobs(self, index: int, uuid: str | None) -> str | None:
        """The jobs a scheduler mapped this card to, if it keeps such a map."""
        return self.job_map.jobs(index, uuid) if self.job_map is not None else None

    def card_allocations(self, gpus: Sequence[GpuSample], wait_s: float = 0.0) -> dict[int, ProcessOwner]:
        """NVML index -> the Slurm job this node's Slurm gave the card to (`wait_s`: how long a
        first answer is waited for; later ones come in the background)."""
        return self.slurm_gres.allocations(gpus, wait_s)


def on_mapped_card(owner: ProcessOwner | None, jobs: str) -> ProcessOwner:
    """The owner of a process on a card mapped to `jobs`: its own Slurm job where its cgroups name
    one (they say which step, too), else the card's."""
    if owner is not None and owner.kind == "slurm":
        return owner
    return ProcessOwner("slurm", jobs, None, owner.user if owner is not None else None)


def container_label(owner: ProcessOwner | None) -> str | None:
    """'docker 3f2a9c0d1e2b', 'k8s pod …': which container a process is in, for people."""
    if owner is None:
        return None
    if owner.kind == "container":
        return f"{owner.engine} {owner.id}"
    if owner.kind == "k8s":
        return f"k8s pod {owner.id}"
    return None
