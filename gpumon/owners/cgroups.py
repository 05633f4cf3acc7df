"""What a process's cgroups (/proc/PID/cgroup) say about who started it: a Slurm job step, a
Kubernetes pod, a Docker or Podman container, a systemd unit.

Each line of the file is `hierarchy:controllers:path`: cgroup v1 has a line per hierarchy
(`4:memory:/slurm/uid_1000/job_42/step_0`), v2 a single `0::/…` line. The shapes are matched by
regular expressions anywhere in a path (as dcgm-exporter's pidmapper does), never by a fixed
prefix: Slurm may run inside a pod, kubelets nest their hierarchy under another slice, and a
container runtime may name its parent however it is configured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpumon.sanitize import printable

# Slurm: `/slurm/uid_<uid>/job_<id>/step_<step>/task_0` (v1; `/slurm_<node>/…` with several
# slurmds), `/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_0` (v2; also
# `<node>_slurmstepd.scope`). Steps are numbers or batch, extern, interactive; a het job's
# component is `<id>+<n>`.
_SLURM = re.compile(r"/[^/]*slurm[^/]*/(?:[^/]+/)*?job_(\d+)(?:/step_([A-Za-z0-9_+]+))?(?=/|$)")

# Kubernetes: `…kubepods…` then the pod's directory: `pod<uid>` (cgroupfs driver, dashes) or
# `kubepods-<qos>-pod<uid_with_underscores>.slice` (systemd driver; guaranteed pods have no QoS
# level), then the container: a bare 64-hex id (cgroupfs) or `<runtime>-<id>.scope`. Static pods'
# UIDs are 32-hex hashes without dashes. A runtime told to use systemd's driver where no systemd
# runs (k3s, kind) writes the cgroup path as its spec gives it: `<pod slice>:cri-containerd:<id>`.
_UID = r"[0-9a-f]{8}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{4}[-_]?[0-9a-f]{12}"
_POD = re.compile(
    rf"kubepods(?:[^/]*/)*?[^/]*?pod({_UID})(?:\.slice)?"
    r"(?:[/:](?:(cri-containerd|crio|docker|containerd)[-:])?([0-9a-f]{64})(?:\.scope)?)?(?=[/:]|$)")
_K8S_RUNTIMES = {"cri-containerd": "containerd", "containerd": "containerd", "crio": "cri-o", "docker": "docker"}

# Docker and Podman outside Kubernetes: `docker-<id>.scope`, `libpod-<id>.scope` (systemd driver;
# Podman may add `/container` below it), `/docker/<id>`, `/libpod_parent/libpod-<id>` (cgroupfs).
# The first match is the host's own engine (a container inside a container is the outer one's).
_CONTAINER = re.compile(r"(?:^|/)(docker|libpod)[-/]([0-9a-f]{64})(?:\.scope)?(?=/|$)")
_ENGINES = {"docker": "docker", "libpod": "podman"}

# A systemd unit: the deepest `.service` or `.scope` in the systemd hierarchy's path.
_UNIT = re.compile(r"[^/]+\.(?:service|scope)")


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    """What the cgroup paths say; None where they say nothing."""

    slurm_job: str | None = None
    slurm_step: str | None = None  # "0", "batch", "extern", "interactive"
    pod_uid: str | None = None  # with dashes, as the API server writes it
    container_id: str | None = None  # the full 64-hex id
    engine: str | None = None  # "docker", "podman" (a container); "containerd", "cri-o", "docker" (a pod)
    unit: str | None = None


def _paths(text: str) -> list[tuple[str, str]]:
    """(controllers, path) of each line; the v2 line's controllers are empty."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2]))
    return out


def parse_cgroup(text: str) -> CgroupFacts:
    """The facts of a /proc/PID/cgroup file's text (v1, v2 or both)."""
    paths = _paths(text)
    slurm_job = slurm_step = pod_uid = container_id = engine = None
    for _, path in paths:
        match = _SLURM.search(path)
        if match:
            slurm_job, slurm_step = match.group(1), match.group(2)
            break
    for _, path in paths:
        match = _POD.search(path)
        if match:
            pod_uid = match.group(1).replace("_", "-")
            container_id = match.group(3)
            engine = _K8S_RUNTIMES.get(match.group(2) or "")
            if container_id:
                break  # another hierarchy may have only the pod's own cgroup: keep looking for the container
    if pod_uid is None:
        for _, path in paths:
            match = _CONTAINER.search(path)
            if match:
                engine, container_id = _ENGINES[match.group(1)], match.group(2)
                break
    return CgroupFacts(slurm_job, slurm_step, pod_uid, container_id, engine, _unit(paths))


def _unit(paths: list[tuple[str, str]]) -> str | None:
    """The deepest unit in the systemd hierarchy: v2's line (on a hybrid host systemd keeps both
    the same), else v1's `name=systemd` line."""
    ordered = sorted(paths, key=lambda p: (p[0] != "", p[0] != "name=systemd"))
    for controllers, path in ordered:
        if controllers not in ("name=systemd", ""):
            continue
        for part in reversed(path.split("/")):
            if _UNIT.fullmatch(part):  # anyone may name a cgroup in their own delegated subtree
                return printable(part[:256])
    return None
