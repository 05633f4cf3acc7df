"""A container job of a user's own rootless Podman (../shared/REAL-MANAGERS.md: vfs storage in the
user's home, no cgroup for the container, its process a child of the user's conmon): the pin
reaches the container, the supervisor (the user's own) follows the container's process by its
id, and the memory limit stops it; `--cpuset-cpus` is not written (rootless Podman has no cgroup to
set it in: conmon inherits the job's CPUs instead)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import test_claims_users
import test_owners_rootless
from conftest import GIB, Card, require_tool
from container_lab import IMAGE, busybox_rootfs

rootless_user = test_owners_rootless.rootless_user
pytestmark = pytest.mark.xdist_group("containers")


def test_a_rootless_podman_job_is_pinned_followed_and_limited(rootless_user, fake_driver):
    require_tool("podman")
    require_tool("newuidmap")
    user = rootless_user
    if not os.access(test_claims_users.PYTHON, os.X_OK):
        pytest.skip(f"{test_claims_users.PYTHON} is needed to run gpumon as another user")
    token = secrets.token_hex(2)
    uuids = [f"GPU-{i}{i}{i}{i}r00t-{token}-1111-2222-33334444555{i}" for i in range(2)]
    fake_driver.machine.cards = [Card(uuid=u, mem_total=40 * GIB, extra={"cpus": "0"}) for u in uuids]
    fake_driver.machine.scan_env = True
    fake_driver.machine.scan_env_ignore = ("podman", "conmon", "runc")
    lib = user.home / "libnvidia-ml.so.1"  # root's pytest folders are not the user's to read
    shutil.copy(fake_driver.lib, lib)
    config = fake_driver.machine.write(user.home / "fake-nvml.conf")
    conf = user.home / "containers.conf"
    conf.write_text('[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]\nnetns = "none"\n'
                    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "none"\n')
    image = busybox_rootfs(user.home / "rootfs.tar")
    place = Path(tempfile.mkdtemp(prefix="gpumon-claims-"))
    os.chmod(place, 0o1777)
    for path in (lib, config, conf, image):
        os.chown(path, user.uid, user.uid)
    env = [f"CONTAINERS_CONF={conf}", f"FAKE_NVML_CONFIG={config}", f"GPUMON_NVML_LIB={lib}",
           f"GPUMON_CLAIMS_DIR={place}", f"XDG_STATE_HOME={user.home}/state", "TZ=UTC",
           f"PYTHONPATH={':'.join([test_claims_users.SOURCE, *test_claims_users.SITE])}"]
    podman = ["podman", "--storage-driver", "vfs"]

    def gpumon(*args: str):
        return user.run(*env, test_claims_users.PYTHON, "-m", "gpumon", *args)

    try:
        done = user.run(*env, *podman, "import", str(image), IMAGE)
        assert done.returncode == 0, done.stderr
        started = gpumon("run", "--interval", "0.2", "--gpu", "1", "--mem-limit", "512M", "--", *podman, "run",
                         "--rm", IMAGE, "sh", "-c", "env; sleep 120")
        assert started.returncode == 0, started.stderr
        assert "container (podman)" in started.stdout and "--cpuset-cpus" not in started.stdout
        deadline = time.monotonic() + 60
        while True:
            (job,) = json.loads(gpumon("jobs", "--json").stdout)
            if job["state"] != "running" or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert job["state"] == "killed", job
        assert job["reason"] == "memory limit exceeded on GPU 1: 1.0 GiB > 512 MiB"
        log = Path(job["log"]).read_text()
        assert f"CUDA_VISIBLE_DEVICES={uuids[1]}" in log.splitlines()
        ps = user.run(*env, *podman, "ps", "-q")
        assert ps.returncode == 0 and ps.stdout.strip() == "", "the container was stopped with its job"
    finally:
        user.run(*env, *podman, "rm", "-a", "-f", "-t", "0")
        shutil.rmtree(place, ignore_errors=True)
