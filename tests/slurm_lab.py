"""A real single-node Slurm for tests (session fixture `real_slurm`): Debian's slurm-wlm and munge
on loopback, proctrack/cgroup and task/cgroup on this host's cgroups, its config, state and
sockets in a directory of its own, and a real user (`useradd`) who submits the jobs. The node
has two GPUs as GRES (`--gres=gpu:N`): gres.conf's `File=` devices are char devices the lab makes
(`mknod`, major 195 as the NVIDIA driver's) with minor numbers GPU_MINORS, in that order. Slow to
start, so one per test session; every daemon is stopped by its pid, the user removed and the
cgroups slurmd made removed at the end. Without the tools or root: skipped with the reason, a
failure when CI=true (../shared/REAL-MANAGERS.md says what runs here)."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import IN_CI, add_suite_user

USER = "gpumonslurm"
GPU_MINORS = (3, 5)  # /dev/nvidia3 is the node's GRES gpu 0, /dev/nvidia5 its gpu 1
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "sinfo", "useradd", "userdel", "runuser")


def _unusable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"a real Slurm is required in CI: {reason}")
    pytest.skip(reason)


def _free_ports(count: int) -> list[int]:
    """`count` consecutive free ports on loopback (SrunPortRange needs a range)."""
    for base in range(21000, 60000, 97):
        if all(_free(base + i) for i in range(count)):
            return list(range(base, base + count))
    raise RuntimeError("no free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _wait(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


class RealSlurm:
    def __init__(self, root: Path, node: str) -> None:
        self.root, self.node = root, node
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: list[subprocess.Popen] = []

    def run(self, *args: str, user: str | None = None, check: bool = True) -> str:
        command = ["runuser", "-u", user, "--", *args] if user else list(args)
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise AssertionError(f"{args}: {done.stderr.strip()}")
        return done.stdout

    def submit(self, script: str, *options: str) -> str:
        """The id sbatch gave the job, submitted as the lab's user."""
        path = self.root / f"job-{time.monotonic_ns()}.sh"
        path.write_text(script)
        path.chmod(0o755)
        return self.run("sbatch", "--parsable", "-D", str(self.root / "work"), *options, str(path),
                        user=USER).strip().split(";")[0]

    def step_pids(self, job: str, command: str, steps: set[str]) -> dict[str, list[int]]:
        """step -> pids whose command is `command`, once each of `steps` has one (scontrol listpids)."""
        found: dict[str, list[int]] = {}

        def ready() -> bool:
            found.clear()
            out = self.run("scontrol", "listpids", job, check=False)
            for line in out.splitlines()[1:]:
                fields = line.split()
                if len(fields) < 3 or not fields[0].isdigit():
                    continue
                try:
                    comm = Path(f"/proc/{fields[0]}/comm").read_text().strip()
                except OSError:
                    continue
                if comm == command and fields[2] in steps:
                    found.setdefault(fields[2], []).append(int(fields[0]))
            return set(found) == steps

        _wait(ready, f"job {job}'s {command} in {steps} steps")
        return dict(found)

    def cancel_all(self) -> None:
        self.run("scancel", "-u", USER, check=False)
        _wait(lambda: not self.run("squeue", "-h", "-u", USER, check=False).strip(), "jobs to end", 30)


def _write_config(root: Path, node: str, ports: list[int]) -> None:
    munge_socket = root / "munge" / "munge.socket"
    devices = root / "dev"
    devices.mkdir()
    for minor in GPU_MINORS:
        os.mknod(devices / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    (root / "gres.conf").write_text("".join(f"Name=gpu File={devices}/nvidia{minor}\n" for minor in GPU_MINORS))
    (root / "slurm.conf").write_text(f"""\
ClusterName=gpumonlab
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={ports[0]}
SlurmdPort={ports[1]}
SrunPortRange={ports[2]}-{ports[-1]}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
PrologFlags=Contain
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
GresTypes=gpu
NodeName={node} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Gres=gpu:{len(GPU_MINORS)} State=UNKNOWN
PartitionName=lab Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
    (root / "cgroup.conf").write_text("CgroupPlugin=autodetect\nCgroupMountpoint=/sys/fs/cgroup\n")


def _remove_cgroups(node: str) -> None:
    """The cgroups slurmd made (`slurm_<node>` in each v1 hierarchy), deepest first."""
    for top in Path("/sys/fs/cgroup").glob(f"*/slurm_{node}"):
        for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            try:
                directory.rmdir()
            except OSError:
                pass
        try:
            top.rmdir()
        except OSError:
            pass


@pytest.fixture(scope="session")
def real_slurm() -> Iterator[RealSlurm]:
    if os.geteuid() != 0:
        _unusable("a real Slurm needs root")
    missing = [t for t in TOOLS if not shutil.which(t)]
    if missing:
        _unusable(f"not installed: {', '.join(missing)}")
    node = socket.gethostname().split(".")[0]
    root = Path(tempfile.mkdtemp(prefix="gpumon-slurm-"))
    root.chmod(0o755)  # the lab's user reads the config and reaches munge's socket
    for sub in ("munge", "state", "spool", "work"):
        (root / sub).mkdir()
    (root / "munge").chmod(0o755)
    (root / "work").chmod(0o1777)
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    _write_config(root, node, _free_ports(6))
    lab = RealSlurm(root, node)
    made_user = False
    try:
        add_suite_user(USER, "-M", "-s", "/bin/sh")
        made_user = True
        lab.daemons.append(subprocess.Popen(
            ["munged", "-F", "--force", f"--key-file={key}", f"--socket={root}/munge/munge.socket",
             f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait(lambda: (root / "munge" / "munge.socket").exists(), "munged's socket", 10)
        lab.daemons.append(subprocess.Popen(["slurmctld", "-D", "-c", "-f", str(lab.conf)], env=lab.env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        lab.daemons.append(subprocess.Popen(["slurmd", "-D", "-f", str(lab.conf)], env=lab.env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            _wait(lambda: lab.run("sinfo", "-h", "-o", "%T", check=False).strip() in ("idle", "mixed"),
                  "the node idle", 40)
        except AssertionError:
            logs = "".join((root / n).read_text()[-600:] for n in ("slurmctld.log", "slurmd.log")
                           if (root / n).exists())
            _unusable(f"Slurm did not start here: {logs}")
        yield lab
    finally:
        if lab.daemons:
            lab.run("scancel", "-u", USER, check=False)
        for daemon in reversed(lab.daemons):
            daemon.terminate()
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait(5)
        _remove_cgroups(node)
        if made_user:
            subprocess.run(["userdel", USER], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
