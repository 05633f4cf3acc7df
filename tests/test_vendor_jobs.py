"""Launching on AMD and Intel cards: the real `gpumon run` and `select` on fake kernel trees, and
a real job that reports the environment and CPUs it got; the memory watchdog reading fdinfo."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import psutil
from conftest import Card, require_tool
from fakedrm import RX7900, RX7900_HWMON, amdgpu_fdinfo

# Inherited from the user's shell, each would move or hide the card under HIP or SYCL.
STRAY = {"HIP_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "GPU-00000000-1111-2222-3333-444455556666",
         "GPU_DEVICE_ORDINAL": "3", "SYCL_DEVICE_FILTER": "opencl"}


def probe(tmp_path: Path) -> list[str]:
    out = tmp_path / "probe.json"
    code = ("import json, os; json.dump({'env': dict(os.environ), 'cpus': sorted(os.sched_getaffinity(0))},"
            f" open({str(out)!r}, 'w'))")
    return [sys.executable, "-c", code]


def wait_for(predicate, timeout: float = 30.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read_probe(tmp_path: Path) -> dict:
    path = tmp_path / "probe.json"
    wait_for(lambda: path.exists() and path.stat().st_size > 0, what="the job's probe")
    time.sleep(0.1)
    return json.loads(path.read_text())


def jobs(kernel) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "gpumon", "jobs", "--json"], env=kernel.env, capture_output=True,
                         text=True, timeout=60)
    return json.loads(out.stdout)


def test_a_job_on_an_amd_card_gets_rocms_uuid_and_the_cards_cpus(fake_kernel, tmp_path):
    fake_kernel.sys.amd(numa=0, cpus="1")
    result = fake_kernel.run("run", "--interval", "0.2", "--gpu", "0", "--", *probe(tmp_path),
                             env=fake_kernel.env | STRAY)
    assert result.returncode == 0, result.stderr
    env = read_probe(tmp_path)
    assert env["env"]["ROCR_VISIBLE_DEVICES"] == "GPU-5a2c1e8172f8a8b6"
    for name in ("HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "CUDA_DEVICE_ORDER"):
        assert name not in env["env"], name
    assert set(env["cpus"]) == ({1} & os.sched_getaffinity(0) or os.sched_getaffinity(0))
    (job,) = jobs(fake_kernel)
    assert job["gpus"] == ["GPU-5a2c1e8172f8a8b6"] and job["gpu_indices"] == [0]


def test_amd_cards_without_a_rocm_uuid_are_pinned_by_their_number_in_pci_order(fake_kernel, tmp_path):
    # Found in another order than their bus ids (card1 is the later bus): ROCm counts in PCI order.
    fake_kernel.sys.amd("0000:43:00.0", files=RX7900, hwmon=RX7900_HWMON, parents=("pci0000:40",), number=1)
    fake_kernel.sys.amd("0000:03:00.0", files=RX7900, hwmon=RX7900_HWMON, parents=("pci0000:00",), number=2)
    result = fake_kernel.run("run", "--interval", "0.2", "--gpu", "00000000:43:00.0", "--", *probe(tmp_path))
    assert result.returncode == 0, result.stderr
    assert read_probe(tmp_path)["env"]["ROCR_VISIBLE_DEVICES"] == "1"
    (job,) = jobs(fake_kernel)
    assert job["gpus"] == ["00000000:43:00.0"] and job["gpu_indices"] == [1]  # named by bus id in its record


def test_a_job_on_an_intel_card_gets_its_level_zero_number(fake_kernel, tmp_path):
    fake_kernel.sys.intel("0000:00:02.0", driver="i915")  # the integrated one: first in PCI order
    fake_kernel.sys.intel("0000:83:00.0", driver="xe", parents=("pci0000:80",))
    result = fake_kernel.run("run", "--interval", "0.2", "--gpu", "1", "--", *probe(tmp_path),
                             env=fake_kernel.env | STRAY)
    assert result.returncode == 0, result.stderr
    env = read_probe(tmp_path)["env"]
    assert (env["ZE_AFFINITY_MASK"], env["ZE_ENABLE_PCI_ID_DEVICE_ORDER"], env["ONEAPI_DEVICE_SELECTOR"]) == (
        "1", "1", "level_zero:*")
    assert "SYCL_DEVICE_FILTER" not in env


def test_one_job_does_not_span_vendors_and_auto_keeps_to_the_first(fake_driver, fake_kernel):
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", extra=dict(util=95))]
    fake_driver.write()
    card = fake_kernel.sys.amd()
    fake_kernel.sys.set(card, "gpu_busy_percent", "0")  # free, but not what a CUDA program is built for
    out = fake_kernel.run("run", "--gpu", "0,1", "--", "true", env=fake_driver.env)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "one job's cards must be of one vendor: GPU 0 (nvidia), GPU 1 (amd)" in out.stderr
    picked = fake_kernel.run("select", "--verbose", env=fake_driver.env)
    assert picked.returncode == 1 and picked.stdout == ""  # the NVIDIA card is busy; the AMD one is not offered
    assert "GPU 1 skipped: an AMD card; auto chooses among the NVIDIA cards (--gpu 1 uses it)" in picked.stderr


def test_select_export_pins_a_shell_to_an_amd_card(fake_kernel):
    card = fake_kernel.sys.amd()
    fake_kernel.sys.set(card, "gpu_busy_percent", "0")  # free
    plain = fake_kernel.run("select")
    assert plain.returncode == 0 and plain.stdout.strip() == "GPU-5a2c1e8172f8a8b6"
    command = " ".join(shlex.quote(a) for a in fake_kernel.argv("select", "--export"))
    script = f'eval "$({command})"; printf "%s|%s" "$ROCR_VISIBLE_DEVICES" "${{HIP_VISIBLE_DEVICES-unset}}"'
    shell = subprocess.run([require_tool("sh"), "-c", script], env=fake_kernel.env | STRAY, capture_output=True,
                           text=True, timeout=60)
    assert shell.stdout == "GPU-5a2c1e8172f8a8b6|unset", shell.stderr


def test_the_watchdog_reads_an_amd_jobs_memory_from_fdinfo(fake_kernel, tmp_path, idle_processes):
    card = fake_kernel.sys.amd()
    bystander = idle_processes()  # someone else's process on the card, far over the limit
    fake_kernel.proc.client(bystander.pid, 5, amdgpu_fdinfo(card.address, 1, vram_kib=20 << 20))
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    result = fake_kernel.run("run", "--interval", "0.2", "--gpu", "0", "--mem-limit", "1G", "--",
                             sys.executable, "-c", script)
    assert result.returncode == 0 and "watchdog" in result.stdout, result.stderr
    pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="the job's pid"))
    fake_kernel.proc.client(pid, 7, amdgpu_fdinfo(card.address, 2, vram_kib=512 << 10))  # under the limit
    time.sleep(1.5)
    (job,) = jobs(fake_kernel)
    assert job["state"] == "running", job
    fake_kernel.proc.client(pid, 7, amdgpu_fdinfo(card.address, 2, vram_kib=2 << 20))  # amdgpu now says 2 GiB
    (job,) = wait_for(lambda: [j for j in jobs(fake_kernel) if j["state"] == "killed"], what="the watchdog")
    assert job["reason"] == "memory limit exceeded on GPU 0: 2.0 GiB > 1.0 GiB"
    assert job["peak_gpu_memory"] == 2 << 30
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert bystander.poll() is None


def test_a_queued_job_starts_on_the_amd_card_once_it_is_free(fake_kernel, tmp_path):
    card = fake_kernel.sys.amd()  # 37 % busy: not free
    result = fake_kernel.run("run", "--interval", "0.2", "--wait", "--gpu", "0", "--", *probe(tmp_path),
                             env=fake_kernel.env | STRAY)
    assert result.returncode == 0 and "queued" in result.stdout, result.stderr
    time.sleep(1.0)
    (job,) = jobs(fake_kernel)
    assert job["state"] == "queued" and not (tmp_path / "probe.json").exists()
    fake_kernel.sys.set(card, "gpu_busy_percent", "0")
    env = read_probe(tmp_path)["env"]
    assert env["ROCR_VISIBLE_DEVICES"] == "GPU-5a2c1e8172f8a8b6" and "HIP_VISIBLE_DEVICES" not in env
