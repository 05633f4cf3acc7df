"""Real cgroups for tests (fixture `cgroup_lab`): directories made in the host's cgroup v1 and v2
hierarchies, under a private `gpumon-test-<random>` directory, in the shapes Slurm, the kubelet,
Docker, Podman and systemd make, with real processes moved into them.

Needs root and a writable cgroupfs (CI has both): without them the test is skipped with the
reason, and fails when CI=true. Everything made is removed afterwards, even when the test fails:
the processes go back to the cgroup they came from, then the directories go, deepest first.
/proc/PID/cgroup shows paths from the hierarchy's root, so they include the private prefix.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
V1_CONTROLLERS = ("pids", "freezer", "devices", "cpu")  # the first one mounted is used


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, type, options) of every cgroup filesystem."""
    out = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            _, point, kind, options, *_ = line.split()
            if kind in ("cgroup", "cgroup2"):
                out.append((point.replace("\\040", " "), kind, set(options.split(","))))
    return out


def _unusable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"real cgroups are required in CI: {reason}")
    pytest.skip(reason)


class Hierarchy:
    """One cgroup hierarchy: where it is mounted, and how /proc/PID/cgroup names it."""

    def __init__(self, mount: Path, line_key: str) -> None:
        self.mount = mount
        self.line_key = line_key  # "" for v2, else a controller ("pids") or "name=…"
        self.root = mount / f"gpumon-test-{secrets.token_hex(4)}"

    def current(self, pid: int) -> str | None:
        """The process's path in this hierarchy."""
        try:
            text = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == self.line_key or (self.line_key and self.line_key in controllers.split(",")):
                return path
        return None


class CgroupLab:
    def __init__(self) -> None:
        self.v1: Hierarchy | None = None
        self.v2: Hierarchy | None = None
        self._made: list[Path] = []
        self._origins: dict[tuple[int, str], Path] = {}  # (pid, hierarchy's mount) -> where it came from
        self._own_mount: Path | None = None

    def open(self) -> None:
        if os.geteuid() != 0:
            _unusable("moving processes between cgroups needs root")
        mounts = _mounts()
        v2 = next((Path(p) for p, kind, _ in mounts if kind == "cgroup2"), None)
        for controller in V1_CONTROLLERS:
            v1 = next((Path(p) for p, kind, options in mounts if kind == "cgroup" and controller in options), None)
            if v1 is not None:
                self.v1 = Hierarchy(v1, controller)
                break
        if self.v1 is None:  # a v2-only host: a named v1 hierarchy of our own has the same shape of lines
            point = Path(tempfile.mkdtemp(prefix="gpumon-cgroup-v1-"))
            name = f"gpumon-test-{secrets.token_hex(3)}"
            mounted = subprocess.run(["mount", "-t", "cgroup", "-o", f"none,name={name}", "cgroup", str(point)],
                                     capture_output=True, text=True)
            if mounted.returncode == 0:
                self._own_mount = point
                self.v1 = Hierarchy(point, f"name={name}")
            else:
                point.rmdir()
        if v2 is not None:
            self.v2 = Hierarchy(v2, "")
        for hierarchy in (self.v1, self.v2):
            if hierarchy is None:
                continue
            try:
                hierarchy.root.mkdir()
            except OSError as exc:
                _unusable(f"cgroupfs at {hierarchy.mount} is not writable: {exc}")
            self._made.append(hierarchy.root)
        if self.v1 is None or self.v2 is None:
            _unusable("this host lacks a cgroup " + ("v1" if self.v1 is None else "v2") + " hierarchy")

    def place(self, hierarchy: Hierarchy, relative: str, pid: int) -> str:
        """Make `relative` under the test root (and its parents) and move `pid` into it; returns
        the path /proc/PID/cgroup now shows."""
        target = hierarchy.root
        for part in Path(relative).parts:
            target = target / part
            if not target.exists():
                target.mkdir()
                self._made.append(target)
        key = (pid, str(hierarchy.mount))
        if key not in self._origins:
            self._origins[key] = hierarchy.mount / (hierarchy.current(pid) or "/").lstrip("/")
        (target / "cgroup.procs").write_text(str(pid))
        shown = "/" + str(target.relative_to(hierarchy.mount))
        assert hierarchy.current(pid) == shown, f"pid {pid} is in {hierarchy.current(pid)}, not {shown}"
        return shown

    def close(self) -> list[str]:
        """Undo everything; what could not be undone, in words."""
        problems = []
        for directory in sorted(self._made, key=lambda p: len(p.parts), reverse=True):
            mount = next((h.mount for h in (self.v1, self.v2) if h and directory.is_relative_to(h.mount)), None)
            try:
                pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                origin = self._origins.get((pid, str(mount)), mount)
                for back in (origin, mount):
                    try:
                        (back / "cgroup.procs").write_text(str(pid))
                        break
                    except OSError:
                        continue
            try:
                directory.rmdir()
            except OSError as exc:
                problems.append(f"{directory}: {exc}")
        if self._own_mount is not None:
            subprocess.run(["umount", str(self._own_mount)], check=False)
            try:
                self._own_mount.rmdir()
            except OSError as exc:
                problems.append(f"{self._own_mount}: {exc}")
        return problems


@pytest.fixture
def cgroup_lab() -> Iterator[CgroupLab]:
    lab = CgroupLab()
    try:
        lab.open()
        yield lab
    finally:
        problems = lab.close()
        assert not problems, f"test cgroups left behind: {problems}"
