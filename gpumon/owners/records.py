"""The host's own records of who runs what, beside the cgroups: the kubelet's pod log directories,
Docker's and Podman's container state, a Slurm job's environment, and the per-card job files a
scheduler's prolog writes. One small reader each; each is asked once per new process (the job
files once per card and sample), and answers None where the record is absent or unreadable.

All of it is text from elsewhere: cut to a sane length and made printable before it is kept.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path

from gpumon.owners.engines import IMAGE_VARIABLES, ROOTLESS_DOCKER, ROOTLESS_PODMAN, open_within
from gpumon.sanitize import printable

MAX_NAME = 253  # a Kubernetes object name is at most this long; longer text is not a name
_MAX_STATE_BYTES = 8 << 20  # a container's state file larger than this is not read
_CACHE_LIMIT = 4096  # names kept at most (pods and containers come and go over weeks)


def _clean(text: str, limit: int = MAX_NAME) -> str:
    return printable(text[:limit])


def _remember(cache: dict, key: object, value: object) -> None:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value


_IMAGE_VARIABLES = tuple(f"{name}=".encode() for name in IMAGE_VARIABLES)


def owner_environment(procfs: Path, pid: int) -> dict[str, str]:
    """The variables of a process's environment that say who owns it, read once: SLURM_* and the
    image of an Apptainer container (/proc/PID/environ: readable by its user and root); empty
    when unreadable."""
    try:
        data = (procfs / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in data.split(b"\0"):
        if item.startswith(b"SLURM_") or item.startswith(_IMAGE_VARIABLES):
            key, _, value = item.partition(b"=")
            out[key.decode("ascii", "replace")] = value.decode("utf-8", "replace")
    return out


def slurm_job_id(job: str, step: str | None, environment: dict[str, str],
                 arrays: SlurmArrays | None = None) -> tuple[str, str | None]:
    """(`JOBID[.STEP]`, the job's name): an array task as `ARRAYJOB_TASK[.STEP]`, as Slurm writes
    it, when the process's environment is this job's; else as Slurm's own tools name it (`arrays`:
    another user's process, whose environment only its user and root may read)."""
    name = None
    if environment.get("SLURM_JOB_ID") == job:  # not a variable inherited from some other job
        array, task = environment.get("SLURM_ARRAY_JOB_ID", ""), environment.get("SLURM_ARRAY_TASK_ID", "")
        if array.isdigit() and task.isdigit():
            job = f"{array}_{task}"
        name = _clean(environment["SLURM_JOB_NAME"]) if environment.get("SLURM_JOB_NAME") else None
    elif arrays is not None and not environment:
        job = arrays.name(job)
    return (f"{job}.{step}" if step else job), name


# Steps whose SLURM_STEP_ID is not a step's number but one of Slurm's markers (0xfffffff0 and up).
_MAX_STEP = 0xFFFFFFF0


def slurm_from_environment(environment: dict[str, str]) -> tuple[str, str | None] | None:
    """The job a process's environment names, where no Slurm cgroup does (proctrack/linuxproc,
    task/affinity): (job, step or None); None when it names none."""
    job = environment.get("SLURM_JOB_ID", "")
    if not job.isdigit() or len(job) > 12:
        return None
    step = environment.get("SLURM_STEP_ID", "")
    return job, (step if step.isdigit() and int(step) < _MAX_STEP else None)


class SlurmArrays:
    """`ARRAYJOB_TASK` of a raw job id, as `scontrol show job` says it: asked once per job id (its
    answer is kept), with a timeout, and only where Slurm's tools are installed. Asked in a thread
    of its own, one job at a time: `name()` answers at once with what is known (the raw id until
    the answer comes), so a slow or hung scontrol never delays a sample; `answers` grows with every
    answer, which tells a reader when a name it was given may have got better. No answer (scontrol
    timed out, or could not reach slurmctld) is asked again later, less often each time: a busy
    controller's moment must not leave a job without its name for the rest of the day."""

    # Slurm's own MessageTimeout (10 s by default) is how long scontrol waits for a busy slurmctld:
    # cut shorter, a controller that answers every question in 3 s never names a task.
    TIMEOUT_S = 10.0
    RETRY_S = (5.0, 300.0)  # the wait after a first question with no answer, and the longest

    def __init__(self, scontrol: str | None = None) -> None:
        self.scontrol = scontrol if scontrol is not None else shutil.which("scontrol")
        self._names: dict[str, str] = {}
        self._asking: set[str] = set()
        self._to_ask: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._waits: dict[str, float] = {}  # job -> the last wait before asking again
        self.answers = 0

    def name(self, job: str) -> str:
        """The job's array name if known; else `job`, and the question is asked in the background."""
        known = self._names.get(job)
        if known is not None:
            return known
        if not self.scontrol or not job.isdigit():
            return job
        with self._lock:
            if job not in self._asking:
                self._asking.add(job)
                self._to_ask.put(job)
                if self._thread is None:  # a daemon: a hung scontrol never holds up gpumon's exit
                    self._thread = threading.Thread(target=self._answer, name="gpumon-scontrol", daemon=True)
                    self._thread.start()
        return job

    def asking(self, job: str) -> bool:
        """Whether the name of `job` is still being asked."""
        return job in self._asking

    def _answer(self) -> None:
        while True:
            job = self._to_ask.get()
            name = self._ask(job)
            if name is None:
                self._ask_later(job)  # still being asked: readers keep the job's owner unsettled
                continue
            with self._lock:
                _remember(self._names, job, name)
                self._asking.discard(job)
                self._waits.pop(job, None)
                self.answers += 1

    def _ask_later(self, job: str) -> None:
        first, longest = self.RETRY_S
        wait = min(2 * self._waits[job], longest) if job in self._waits else first
        _remember(self._waits, job, wait)
        timer = threading.Timer(wait, self._to_ask.put, (job,))
        timer.daemon = True
        timer.start()

    def _ask(self, job: str) -> str | None:
        """The job's name, its raw id where it is no array task (or Slurm no longer knows it), or
        None for no answer."""
        try:
            done = subprocess.run([self.scontrol, "-o", "show", "job", job], capture_output=True,
                                  timeout=self.TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
        except OSError:  # it cannot be run: that will not get better
            return job
        except subprocess.SubprocessError:
            return None
        if done.returncode != 0:
            return job if b"Invalid job id" in done.stderr else None
        fields = dict(item.partition("=")[::2] for item in done.stdout.decode("utf-8", "replace").split())
        array, task = fields.get("ArrayJobId", ""), fields.get("ArrayTaskId", "")
        if fields.get("JobId") == job and array.isdigit() and task.isdigit():
            return f"{array}_{task}"
        return job


class PodNames:
    """`namespace/pod (container)` of a pod UID, from the kubelet's log directories:
    `<pods_dir>/<namespace>_<pod>_<uid>/<container>/`, and the links beside them in
    `<pods_dir>/../containers/<pod>_<namespace>_<container>-<container id>.log` that say which
    container an id is. Namespaces, pod and container names cannot hold "_", so the names split
    cleanly."""

    def __init__(self, pods_dir: Path) -> None:
        self.pods_dir = pods_dir
        self.links_dir = pods_dir.parent / "containers"
        self._pods: dict[str, tuple[str, str, str]] = {}  # uid -> (namespace, pod, directory name)
        self._containers: dict[str, str] = {}  # container id -> container name

    def name(self, uid: str, container_id: str | None) -> str | None:
        pod = self._pod(uid)
        if pod is None:
            return None
        namespace, name, _ = pod
        container = self._container(pod, container_id)
        return _clean(f"{namespace}/{name}" + (f" ({container})" if container else ""), 2 * MAX_NAME)

    def _pod(self, uid: str) -> tuple[str, str, str] | None:
        known = self._pods.get(uid)
        if known is not None:
            return known
        suffix = "_" + uid
        try:
            with os.scandir(self.pods_dir) as entries:
                for entry in entries:
                    if entry.name.endswith(suffix):
                        namespace, _, pod = entry.name[:-len(suffix)].partition("_")
                        if namespace and pod:
                            _remember(self._pods, uid, (namespace, pod, entry.name))
                            return self._pods[uid]
        except OSError:
            pass
        return None

    def _container(self, pod: tuple[str, str, str], container_id: str | None) -> str | None:
        """The container's name: from its log link when the id is known, else the pod's only
        container directory (with init containers or sidecars there are several: not known)."""
        namespace, name, directory = pod
        if container_id:
            known = self._containers.get(container_id)
            if known is not None:
                return known
            prefix, suffix = f"{name}_{namespace}_", f"-{container_id}.log"
            try:
                with os.scandir(self.links_dir) as entries:
                    for entry in entries:
                        if entry.name.startswith(prefix) and entry.name.endswith(suffix):
                            container = entry.name[len(prefix):-len(suffix)]
                            if container:
                                _remember(self._containers, container_id, container)
                                return container
            except OSError:
                pass
        try:
            with os.scandir(self.pods_dir / directory) as entries:
                containers = [entry.name for entry in entries if entry.is_dir()]
        except OSError:
            return None
        return containers[0] if len(containers) == 1 else None


# containers/storage keeps its containers' names in `<root>/<driver>-containers/containers.json`.
PODMAN_DRIVERS = ("overlay", "vfs", "btrfs", "zfs")


class ContainerNames:
    """A Docker or Podman container's name, from the engine's state on disk: Docker's
    `<docker_dir>/containers/<id>/config.v2.json` ("Name": "/llama"), Podman's (containers/storage)
    `<podman_dir>/<driver>-containers/containers.json` ([{"id": …, "names": ["llama"]}, …]) for
    each storage driver (overlay, vfs, btrfs, zfs): a root may hold several. A rootless engine's
    are the same files under its user's `home` (owners/engines), read as another user's files."""

    def __init__(self, docker_dir: Path, podman_dir: Path) -> None:
        self.docker_dir = docker_dir
        self.podman_dir = podman_dir
        self._docker: dict[tuple[Path, str], str] = {}
        # file -> ((mtime, size), id -> name): read again only when it changed
        self._podman: dict[Path, tuple[tuple[int, int], dict[str, str]]] = {}

    def name(self, engine: str, container_id: str, home: Path | None = None) -> str | None:
        """`home`: the rootless engine's user's home (None: the host's engine)."""
        if engine == "docker":
            return self._docker_name(home / ROOTLESS_DOCKER if home else self.docker_dir, container_id, home)
        if engine == "podman":
            root = home / ROOTLESS_PODMAN if home else self.podman_dir
            for driver in PODMAN_DRIVERS:
                name = self._podman_name(root / f"{driver}-containers" / "containers.json", container_id, home)
                if name is not None:
                    return name
        return None

    def _docker_name(self, docker_dir: Path, container_id: str, home: Path | None) -> str | None:
        known = self._docker.get((docker_dir, container_id))
        if known is not None:
            return known
        state = _read_json(docker_dir / "containers" / container_id / "config.v2.json", home)
        name = state.get("Name") if isinstance(state, dict) else None
        if not isinstance(name, str) or not name.strip("/"):
            return None
        _remember(self._docker, (docker_dir, container_id), _clean(name.lstrip("/")))
        return self._docker[(docker_dir, container_id)]

    def _podman_name(self, path: Path, container_id: str, home: Path | None) -> str | None:
        try:
            stat = os.stat(path)
        except OSError:
            self._podman.pop(path, None)
            return None
        version = (stat.st_mtime_ns, stat.st_size)
        known = self._podman.get(path)
        if known is None or known[0] != version:
            names = {}
            state = _read_json(path, home)
            for entry in state if isinstance(state, list) else ():
                if not isinstance(entry, dict) or not isinstance(entry.get("id"), str) \
                        or not isinstance(entry.get("names"), list):
                    continue
                first = next((n for n in entry["names"] if isinstance(n, str) and n), None)
                if first is not None:
                    names[entry["id"]] = _clean(first)
            if len(self._podman) >= _CACHE_LIMIT:
                self._podman.clear()
            known = self._podman[path] = (version, names)
        return known[1].get(container_id)


def _read_json(path: Path, home: Path | None = None) -> object:
    """`home`: the file is a user's, read only where it really is under that home."""
    if home is not None:
        data = open_within(home, path, _MAX_STATE_BYTES)
    else:
        try:
            with open(path, "rb") as file:
                data = file.read(_MAX_STATE_BYTES + 1)
        except OSError:
            return None
    if data is None or len(data) > _MAX_STATE_BYTES:
        return None
    try:
        return json.loads(data)
    except ValueError:  # also UnicodeDecodeError
        return None


class JobMap:
    """The jobs on each card as a scheduler's prolog records them, as dcgm-exporter's
    `--hpc-job-mapping-dir` reads them: a file per card, named by its index or UUID, with the ids
    of the jobs on it, one a line. The prolog writes a file and the epilog removes it, so each is
    looked at every sample (a stat) and read again only when it changed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, tuple[tuple[int, int], str | None]] = {}

    def jobs(self, index: int, uuid: str | None) -> str | None:
        """The card's jobs (several joined by ","), or None: no file, or an empty one."""
        for name in (str(index), uuid):
            if not name or "/" in name:
                continue
            path = os.path.join(self.directory, name)
            try:
                stat = os.stat(path)
            except OSError:
                self._files.pop(name, None)
                continue
            version = (stat.st_mtime_ns, stat.st_size)
            known = self._files.get(name)
            if known is None or known[0] != version:
                known = (version, self._read(path))
                _remember(self._files, name, known)
            if known[1]:
                return known[1]
        return None

    @staticmethod
    def _read(path: str) -> str | None:
        try:
            with open(path, "rb") as file:
                data = file.read(64 << 10)
        except OSError:
            return None
        ids: list[str] = []
        for line in data.decode("utf-8", "replace").splitlines():
            job = line.strip()
            if job and job not in ids:
                ids.append(_clean(job, 64))
        return ",".join(ids[:64]) or None
