"""Real container engines for the container-job tests (../shared/REAL-MANAGERS.md): rootful Podman
with storage, run root and config of the test run's own (runc, vfs, cgroupfs, the ulimit and
netns workarounds), and a `dockerd` of its own (own data root, exec root and socket, no iptables,
no bridge; the NVIDIA toolkit's `nvidia-container-runtime-hook` as a stand-in on its PATH, so
`--gpus` starts), each with a busybox image imported from a rootfs tarball (nothing is pulled).
CDI specs for the fake cards (`cdi_spec`) name device nodes the test made with `mknod`.

Session fixtures: slow to set up, shared by a worker's tests. Every daemon is stopped by its pid,
containers, images and storage removed, spec files deleted. Without the tools or root: skipped
with the reason, a failure when CI=true.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import IN_CI

IMAGE = "localhost/gpumon-busybox"
_PROGRAMS = ("sh", "sleep", "env", "cat", "ls", "grep", "true")


def _unusable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


def busybox_rootfs(path: Path) -> Path:
    """A rootfs tarball of busybox-static and its applets' links, for `podman/docker import`."""
    if not Path("/bin/busybox").exists():
        _unusable("busybox-static is not installed")
    with tarfile.open(path, "w") as tar:
        tar.add("/bin/busybox", arcname="bin/busybox")
        for name in _PROGRAMS:
            link = tarfile.TarInfo(f"bin/{name}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link, io.BytesIO())
    os.chmod(path, 0o644)  # a rootless user imports it too
    return path


def engine_cgroups(name: str) -> set[Path]:
    """The engine's parent cgroup (`docker`, `libpod_parent`) in each hierarchy that has it."""
    root = Path("/sys/fs/cgroup")
    return {p for p in [root / name, *root.glob(f"*/{name}")] if p.is_dir()}


def remove_new_cgroups(name: str, before: set[Path]) -> None:
    """The engine's parent cgroups this lab made, once empty (one in use stays: rmdir refuses it)."""
    for top in engine_cgroups(name) - before:
        for path in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [top]:
            try:
                path.rmdir()
            except OSError:
                pass


@dataclass
class Engine:
    """An engine as the user would type it: `words` before the subcommand, `env` to run it with."""

    name: str
    words: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def __call__(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        done = subprocess.run([*self.words, *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env})
        if check:
            assert done.returncode == 0, f"{self.name} {args[0]}: {done.stderr.strip()}"
        return done.stdout.strip()

    def shell(self) -> str:
        """The words as one shell line (the TUI's run dialog)."""
        import shlex
        return shlex.join(self.words)


@pytest.fixture(scope="session")
def podman_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    if not shutil.which("podman") or not shutil.which("runc"):
        _unusable("podman and runc are not installed")
    if os.geteuid() != 0:
        pytest.skip("rootful Podman with cgroupfs needs root")
    base = tmp_path_factory.mktemp("podman")
    runroot = Path(tempfile.mkdtemp(prefix="gpumon-pr-"))  # Podman wants a run root under 50 characters
    conf = base / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\nnetns = "none"\n'
                    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "none"\n')
    engine = Engine("podman", ["podman", "--root", str(base / "storage"), "--runroot", str(runroot),
                               "--storage-driver", "vfs"], {"CONTAINERS_CONF": str(conf)})
    cgroups_before = engine_cgroups("libpod_parent")
    engine("import", str(busybox_rootfs(base / "rootfs.tar")), IMAGE)
    try:
        yield engine
    finally:
        engine("rm", "-a", "-f", "-t", "0", check=False)
        remove_new_cgroups("libpod_parent", cgroups_before)
        engine("rmi", "-a", "-f", check=False)
        subprocess.run(["umount", "-R", str(runroot)], capture_output=True)
        shutil.rmtree(runroot, ignore_errors=True)
        shutil.rmtree(base / "storage", ignore_errors=True)


@pytest.fixture(scope="session")
def docker_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    dockerd = shutil.which("dockerd") or (Path("/usr/sbin/dockerd") if Path("/usr/sbin/dockerd").exists() else None)
    docker = Path("/usr/bin/docker") if Path("/usr/bin/docker").exists() else shutil.which("docker")
    if not dockerd or not docker:
        _unusable("Debian's docker.io is not installed")
    if os.geteuid() != 0:
        pytest.skip("dockerd needs root")
    base = Path(tempfile.mkdtemp(prefix="gpumon-dk-"))  # a socket path must be short
    hooks = base / "bin"
    hooks.mkdir()
    hook = hooks / "nvidia-container-runtime-hook"  # what --gpus asks for: the toolkit's prestart hook
    hook.write_text("#!/bin/sh\ncat >/dev/null\nexit 0\n")
    hook.chmod(0o755)
    socket = base / "docker.sock"
    cgroups_before = engine_cgroups("docker")
    log = open(base / "dockerd.log", "wb")
    daemon = subprocess.Popen(
        [str(dockerd), "--iptables=false", "--ip6tables=false", "--bridge=none", "-H", f"unix://{socket}",
         "--data-root", str(base / "data"), "--exec-root", str(base / "exec"), "--pidfile", str(base / "docker.pid")],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PATH": f"{hooks}:{os.environ['PATH']}"},
        start_new_session=True)
    engine = Engine("docker", [str(docker), "-H", f"unix://{socket}"])
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([*engine.words, "version"], capture_output=True).returncode != 0:
            if daemon.poll() is not None or time.monotonic() > deadline:
                _unusable("dockerd did not start: " + (base / "dockerd.log").read_text()[-500:])
            time.sleep(0.2)
        engine("import", str(busybox_rootfs(base / "rootfs.tar")), IMAGE)
        yield engine
    finally:
        subprocess.run([*engine.words, "rm", "-f", *engine("ps", "-aq", check=False).split()], capture_output=True)
        daemon.send_signal(signal.SIGTERM)  # dockerd stops the containerd it started
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        remove_new_cgroups("docker", cgroups_before)
        for mount in sorted((line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                             if line.split()[1].startswith(str(base))), reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def cdi_spec(tmp_path: Path):
    """cdi_spec(uuids, names) writes /etc/cdi/gpumon-test-*.json naming each card by UUID and/or
    index (`nvidia-ctk cdi generate`'s strategies), each a device node the test made (`mknod c 195
    N`); removed after the test."""
    made: list[Path] = []

    def write(uuids: list[str], names: tuple[str, ...] = ("uuid", "index")) -> Path:
        devices = []
        for i, uuid in enumerate(uuids):
            node = tmp_path / f"nvidia{i}"
            if not node.exists():
                os.mknod(node, 0o666 | 0o020000, os.makedev(195, i))
            edits = {"deviceNodes": [{"path": f"/dev/nvidia{i}", "hostPath": str(node)}],
                     "env": [f"NVIDIA_VISIBLE_DEVICES={uuid}"]}
            devices += [{"name": uuid if by == "uuid" else str(i), "containerEdits": edits} for by in names]
        Path("/etc/cdi").mkdir(exist_ok=True)
        spec = Path("/etc/cdi") / f"gpumon-test-{os.getpid()}-{tmp_path.name}.json"
        spec.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": devices,
                                    "containerEdits": {}}))
        made.append(spec)
        return spec

    yield write
    for spec in made:
        spec.unlink(missing_ok=True)
