"""A real Podman container on vfs storage (Debian's podman 4.3 with runc, the ulimit workaround of
../shared/REAL-MANAGERS.md, an image built from busybox-static): its process's owner is the
container, by the name Podman gave it, read from `<root>/vfs-containers/containers.json`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import IN_CI, require_tool
from container_lab import busybox_rootfs, engine_cgroups, remove_new_cgroups

from gpumon.owners.reader import HostPaths, OwnerReader

NAME = "gpumon-vfs-box"
pytestmark = pytest.mark.xdist_group("containers")  # beside the other Podman tests: their cgroups are removed


def test_a_podman_container_on_vfs_storage_has_its_name(tmp_path):
    podman = require_tool("podman")
    require_tool("runc")
    if not Path("/bin/busybox").exists():
        if IN_CI:
            pytest.fail("busybox-static is required in CI")
        pytest.skip("busybox-static is not installed")
    if os.geteuid() != 0:
        pytest.skip("Podman with cgroupfs needs root here")
    root = tmp_path / "storage"
    runroot = Path(tempfile.mkdtemp(prefix="gpumon-podman-"))  # Podman wants a runroot under 50 characters
    base = [podman, "--root", str(root), "--runroot", str(runroot), "--storage-driver", "vfs",
            "--cgroup-manager", "cgroupfs", "--runtime", "runc", "--events-backend", "none"]
    image = busybox_rootfs(tmp_path / "rootfs.tar")
    cgroups_before = engine_cgroups("libpod_parent")

    def run(*args: str) -> str:
        done = subprocess.run([*base, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"podman {args[0]}: {done.stderr.strip()}"
        return done.stdout.strip()

    run("import", str(image), "localhost/gpumon-busybox")
    try:
        run("run", "-d", "--network=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
            "--name", NAME, "localhost/gpumon-busybox", "/bin/sleep", "600")
        pid = int(run("inspect", "-f", "{{.State.Pid}}", NAME))
        cid = run("inspect", "-f", "{{.Id}}", NAME)
        assert (root / "vfs-containers" / "containers.json").exists()
        assert not (root / "overlay-containers" / "containers.json").exists()
        owner = OwnerReader(HostPaths(podman_dir=root)).read(pid, "root")
        assert (owner.kind, owner.engine, owner.id, owner.name, owner.label) == \
               ("container", "podman", cid[:12], NAME, f"podman:{NAME}")
    finally:
        subprocess.run([*base, "rm", "-f", "-t", "0", NAME], capture_output=True, timeout=60)
        subprocess.run([*base, "rmi", "-f", "localhost/gpumon-busybox"], capture_output=True, timeout=60)
        shutil.rmtree(runroot, ignore_errors=True)
        remove_new_cgroups("libpod_parent", cgroups_before)
