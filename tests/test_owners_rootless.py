"""A real rootless Podman container (Debian's podman 4.3 with runc, vfs storage in its user's home,
no cgroup of its own: its process stays in its caller's, a child of conmon): its owner is the
container by the name Podman gave it, and the pid it has inside is shown beside the host's, in
`snapshot --json` too (the fake driver lists the container's process on the card its
CUDA_VISIBLE_DEVICES names). A rootless Docker container is known the same way, by its shim."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import IN_CI, Card, add_suite_user, end_users_processes, require_tool
from container_lab import busybox_rootfs
from test_jobs import wait_for

from gpumon.owners.containers import container_pid
from gpumon.owners.reader import OwnerReader

NAME = "gpumon-rootless-box"
pytestmark = pytest.mark.xdist_group("containers")  # one Podman test at a time, as the others
UUID = "GPU-0000c0de-aaaa-bbbb-cccc-0000000000{}"


def _append(path: str, line: str) -> None:
    with open(path, "a") as file:
        file.write(line)


def _remove_line(path: str, line: str) -> None:
    with open(path) as file:
        kept = [old for old in file if old != line]
    with open(path, "w") as file:
        file.writelines(kept)


class RootlessUser:
    """A user of its own, with a home the password database names and subordinate ids."""

    def __init__(self, name: str, home: Path, runtime: Path) -> None:
        self.name, self.home, self.runtime = name, home, runtime
        self.uid = pwd.getpwnam(name).pw_uid

    def run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", f"HOME={self.home}",
                               f"XDG_RUNTIME_DIR={self.runtime}", f"PATH={os.environ['PATH']}", *argv],
                              capture_output=True, text=True, timeout=timeout, cwd="/")

    def podman(self, *args: str) -> str:
        done = self.run("podman", "--storage-driver", "vfs", "--runtime", "runc", "--events-backend", "none",
                        "--cgroup-manager", "cgroupfs", *args)
        assert done.returncode == 0, f"podman {args[0]}: {done.stderr.strip()}"
        return done.stdout.strip()


@pytest.fixture
def rootless_user():
    require_tool("useradd")
    require_tool("runuser")
    if os.geteuid() != 0:
        pytest.skip("making users needs root")
    name = f"rootless{secrets.token_hex(3)}"
    home = Path(tempfile.mkdtemp(prefix="gpumon-rootless-"))
    runtime = Path(tempfile.mkdtemp(prefix="gpumon-rt-"))  # conmon's socket paths must stay short
    add_suite_user(name, "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh")
    user = RootlessUser(name, home, runtime)
    for path in (home, runtime):
        os.chown(path, user.uid, user.uid)
        os.chmod(path, 0o700)
    lines = {path: f"{name}:{400000 + (user.uid % 1000) * 65536}:65536\n" for path in ("/etc/subuid", "/etc/subgid")}
    for path, line in lines.items():
        _append(path, line)
    try:
        yield user
    finally:
        end_users_processes(name)
        for path, line in lines.items():
            _remove_line(path, line)
        # The container's files belong to the user's subordinate ids: root removes them.
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
        subprocess.run(["userdel", name], capture_output=True)


def test_a_rootless_podman_container_is_named_and_its_inside_pid_shown(rootless_user, fake_driver, tmp_path):
    require_tool("podman")
    require_tool("runc")
    require_tool("newuidmap")
    if not Path("/bin/busybox").exists():
        if IN_CI:
            pytest.fail("busybox-static is required in CI")
        pytest.skip("busybox-static is not installed")
    user = rootless_user
    uuid = UUID.format(secrets.token_hex(1))
    fake_driver.machine.cards = [Card(uuid=uuid)]
    fake_driver.machine.scan_env = True
    fake_driver.write()
    image = busybox_rootfs(user.home / "rootfs.tar")
    os.chown(image, user.uid, user.uid)
    user.podman("import", str(image), "localhost/gpumon-busybox")
    try:
        user.podman("run", "-d", "--network=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                    "-e", f"CUDA_VISIBLE_DEVICES={uuid}", "--name", NAME, "localhost/gpumon-busybox",
                    "/bin/sleep", "600")
        pid = int(user.podman("inspect", "-f", "{{.State.Pid}}", NAME))
        cid = user.podman("inspect", "-f", "{{.Id}}", NAME)
        # Rootless, with no systemd: the container has no cgroup of its own.
        assert cid not in Path(f"/proc/{pid}/cgroup").read_text()
        assert (user.home / ".local/share/containers/storage/vfs-containers/containers.json").exists()
        owner = OwnerReader().read(pid, user.name)
        assert (owner.kind, owner.engine, owner.id, owner.name, owner.label) == \
               ("container", "podman", cid[:12], NAME, f"podman:{NAME}")
        nspid = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("NSpid:")).split()
        assert container_pid(pid) == int(nspid[-1]) == 1  # the container's command is its init

        def listed():
            doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
            return next((p for p in doc["gpus"][0]["processes"] if p["pid"] == pid), None)

        process = wait_for(listed, timeout=30, what="the container's process on its card")
        assert process["container_pid"] == 1
        assert (process["owner"]["engine"], process["owner"]["name"]) == ("podman", NAME)
    finally:
        user.podman("rm", "-f", "-t", "0", NAME)
        user.podman("rmi", "-f", "localhost/gpumon-busybox")


def test_a_rootless_docker_container_is_named_from_its_users_data_root_and_no_link_leads_out(rootless_user):
    """Rootless Docker's shim (`containerd-shim-runc-v2 -namespace moby -id ID`, run as its user)
    watches the container's process; its name is in the user's `~/.local/share/docker`. A record
    there that is a link to a file outside the home names nothing."""
    user = rootless_user
    named, linked = secrets.token_hex(32), secrets.token_hex(32)
    containers = user.home / ".local/share/docker/containers"
    (containers / named).mkdir(parents=True)
    (containers / named / "config.v2.json").write_text(json.dumps({"Name": "/llama"}))
    outside = Path(tempfile.mkdtemp(prefix="gpumon-outside-"))
    (outside / "config.v2.json").write_text(json.dumps({"Name": "/root-only"}))
    (containers / linked).mkdir()
    (containers / linked / "config.v2.json").symlink_to(outside / "config.v2.json")
    for path in (user.home / ".local", *(user.home / ".local").rglob("*")):
        os.lchown(path, user.uid, user.uid)
    shim = user.home / "containerd-shim-runc-v2"
    shim.write_text("#!/bin/sh\nsleep 600 &\necho $!\nwait\n")
    shim.chmod(0o755)
    os.chown(shim, user.uid, user.uid)
    shims = []
    try:
        for cid in (named, linked):
            proc = subprocess.Popen(["runuser", "-u", user.name, "--", str(shim), "-namespace", "moby", "-id", cid],
                                    stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            shims.append((proc, int(proc.stdout.readline())))
        reader = OwnerReader()
        owner = reader.read(shims[0][1], user.name)
        assert (owner.kind, owner.engine, owner.id, owner.name) == ("container", "docker", named[:12], "llama")
        assert reader.read(shims[1][1], user.name).label == f"docker:{linked[:12]}"
    finally:
        end_users_processes(user.name)
        for proc, _ in shims:
            proc.wait(10)
        shutil.rmtree(outside, ignore_errors=True)
