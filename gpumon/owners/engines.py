"""Containers that no cgroup names: rootless Podman and Docker (without systemd they make no
cgroup of their own: the container's processes stay in their caller's), containerd's containers
(nerdctl), and Apptainer/Singularity, which makes none at all.

Podman's and containerd's containers are known by the process that watches them, an ancestor of
every process in the container: Podman's `conmon` (`-c <id> -n <name>`) and
containerd's shim (`containerd-shim-runc-v2 -namespace <ns> -id <id>`; Docker's namespace is
`moby`, Kubernetes' `k8s.io`). The walk up is bounded (MAX_DEPTH) and done once per process (the
enricher keeps the owner by pid and start time). An Apptainer container is known by
`APPTAINER_CONTAINER` (`SINGULARITY_CONTAINER`) in its environment: the image it runs.

Rootless engines keep their records in their user's home (the user of the watching process, from
the password database: never $HOME): `~/.local/share/containers/storage` (Podman),
`~/.local/share/docker` (Docker), `~/.local/share/nerdctl` (nerdctl). What is there is another
user's: read with size caps, only regular files, never through a link that leads out of it.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from gpumon.owners.containers import status_fields
from gpumon.sanitize import printable

MAX_DEPTH = 32  # ancestors looked at, at most (a container's init is its watcher's child)
MAX_NAME = 253
_MAX_ARGV_BYTES = 64 << 10
_MAX_NAME_FILES = 4096  # names looked through in one nerdctl namespace, at most
_ID = re.compile(r"[0-9a-f]{64}")
_NAMESPACE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,75}")

# The environment's word for the image an Apptainer (formerly Singularity) container runs.
IMAGE_VARIABLES = {"APPTAINER_CONTAINER": "apptainer", "SINGULARITY_CONTAINER": "singularity"}

# Where a rootless engine keeps its records, under its user's home.
ROOTLESS_PODMAN = Path(".local/share/containers/storage")
ROOTLESS_DOCKER = Path(".local/share/docker")
ROOTLESS_NERDCTL = Path(".local/share/nerdctl")


@dataclass(frozen=True, slots=True)
class Watcher:
    """The container an ancestor's command line names: `engine` "podman", "docker" or "nerdctl";
    `id` the full id; `name` as the command line gives it (conmon's -n), else None; `uid` the
    watcher's user (whose home keeps a rootless engine's records); `namespace` containerd's."""

    engine: str
    id: str
    name: str | None
    uid: int | None
    namespace: str | None = None


def _stat_fields(procfs: Path, pid: int) -> tuple[str, int] | None:
    """(comm, parent pid) of a process; None when it is gone."""
    try:
        data = (procfs / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    head, _, rest = data.rpartition(b")")
    fields = rest.split()
    if len(fields) < 2 or not fields[1].isdigit():
        return None
    return head.partition(b"(")[2].decode(errors="replace"), int(fields[1])


def _argv(procfs: Path, pid: int) -> list[str]:
    try:
        with open(procfs / str(pid) / "cmdline", "rb") as file:
            data = file.read(_MAX_ARGV_BYTES)
    except OSError:
        return []
    return [part.decode(errors="replace") for part in data.split(b"\0") if part]


def _real_uid(procfs: Path, pid: int) -> int | None:
    fields = status_fields(pid, "Uid", procfs) or []
    return int(fields[0]) if fields and fields[0].isdigit() else None


def _options(argv: list[str], names: dict[str, str]) -> dict[str, str]:
    """The values of the options `names` (flag -> key) in `argv`: `-c ID`, `--cid=ID`, `-id ID`."""
    out: dict[str, str] = {}
    for i, word in enumerate(argv):
        flag, equals, value = word.partition("=")
        key = names.get(flag)
        if key is None or key in out:
            continue
        if not equals:
            if i + 1 >= len(argv):
                continue
            value = argv[i + 1]
        out[key] = value
    return out


_CONMON = {"-c": "id", "--cid": "id", "-n": "name", "--name": "name"}
_SHIM = {f"{dashes}{flag}": flag for flag in ("id", "namespace") for dashes in ("-", "--")}


def _watcher(procfs: Path, pid: int, comm: str) -> Watcher | None:
    """The container this process watches, if it is conmon or a containerd shim."""
    if comm == "conmon":
        found = _options(_argv(procfs, pid), _CONMON)
        if not _ID.fullmatch(found.get("id", "")):
            return None
        name = found.get("name")
        return Watcher("podman", found["id"], printable(name[:MAX_NAME]) if name else None, _real_uid(procfs, pid))
    if comm.startswith("containerd-shim"):  # the kernel keeps 15 characters: all of "containerd-shim"
        found = _options(_argv(procfs, pid), _SHIM)
        namespace = found.get("namespace", "")
        if not _ID.fullmatch(found.get("id", "")) or not _NAMESPACE.fullmatch(namespace) or namespace == "k8s.io":
            return None  # Kubernetes' containers are its pods'
        engine = "docker" if namespace == "moby" else "nerdctl"
        return Watcher(engine, found["id"], None, _real_uid(procfs, pid), namespace=namespace)
    return None


def watching_ancestor(procfs: Path, pid: int) -> Watcher | None:
    """The container one of this process's ancestors (up to MAX_DEPTH, never pid 1) watches."""
    seen = _stat_fields(procfs, pid)
    for _ in range(MAX_DEPTH):
        if seen is None:
            return None
        parent = seen[1]
        if parent <= 1:
            return None
        seen = _stat_fields(procfs, parent)
        if seen is not None:
            found = _watcher(procfs, parent, seen[0])
            if found is not None:
                return found
    return None


def image_container(environment: dict[str, str]) -> tuple[str, str] | None:
    """(engine, image file name) of an Apptainer/Singularity container, from its environment."""
    for variable, engine in IMAGE_VARIABLES.items():
        image = environment.get(variable, "").rstrip("/")
        name = image.rpartition("/")[2]
        if name:
            return engine, printable(name[:MAX_NAME])
    return None


def home_of(uid: int | None) -> Path | None:
    """A user's home, as the password database has it; None for root (the engines' records are
    then the host's) or a user it does not know."""
    if uid is None or uid == 0:
        return None
    try:
        home = pwd.getpwuid(uid).pw_dir
    except KeyError:
        return None
    return Path(home) if home.startswith("/") and home != "/" else None


def open_within(home: Path, path: Path, limit: int) -> bytes | None:
    """The first `limit` bytes of `path`, a regular file that is really under `home` (no link
    leads out of it); None otherwise, or when it is larger than `limit`."""
    try:
        real = os.path.realpath(path)
        if not real.startswith(os.path.realpath(home) + os.sep):
            return None
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def nerdctl_name(data_root: Path, namespace: str, container_id: str, home: Path | None) -> str | None:
    """A nerdctl container's name: its name store keeps a file per name,
    `<data root>/<hash of containerd's address>/names/<namespace>/<name>`, holding the id."""
    try:
        stores = [entry.path for entry in os.scandir(data_root) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    for store in stores[:16]:
        names = Path(store) / "names" / namespace
        try:
            with os.scandir(names) as entries:
                for n, entry in enumerate(entries):
                    if n >= _MAX_NAME_FILES:
                        break
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    data = open_within(home or data_root, Path(entry.path), 128)
                    if data is not None and data.strip() == container_id.encode():
                        return printable(entry.name[:MAX_NAME])
        except OSError:
            continue
    return None
