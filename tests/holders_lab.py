"""Holders to test with: three real processes in real cgroups — Slurm job 77 on cards 0 and 1, a
Kubernetes pod on card 0, a Docker container on card 2 — that the fake NVIDIA driver lists with
their memory and per-process SM % (`set_load`)."""

from __future__ import annotations

import time

from conftest import GIB, Card

POD = "0a0a0a0a-1b1b-2c2c-3d3d-4e4e4e4e4e4e"
CONTAINER = "ab" * 32
FAKE_RELOAD_S = 0.1  # the fake driver looks at its file at most every 50 ms


def place_holders(cgroup_lab, idle_processes, fake_driver) -> dict[str, int]:
    """The three processes, placed and listed (job 60 % SM, pod 20 %, container 0 %); their pids."""
    job, pod, box = (idle_processes("sleep", "600") for _ in range(3))
    cgroup_lab.place(cgroup_lab.v2, "system.slice/slurmstepd.scope/job_77/step_0/user/task_0", job.pid)
    cgroup_lab.place(cgroup_lab.v2, f"kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/"
                                    f"cri-containerd-{'cd' * 32}.scope", pod.pid)
    cgroup_lab.place(cgroup_lab.v1, f"docker/{CONTAINER}", box.pid)
    fake_driver.machine.cards = [Card(extra={"power_mw": 300_000}), Card(extra={"power_mw": 200_000}),
                                 Card(extra={"power_mw": 100_000})]
    pids = {"job": job.pid, "pod": pod.pid, "box": box.pid}
    set_load(fake_driver, pids, job_sm=60, pod_sm=20, box_sm=0)
    return pids


def set_load(fake_driver, pids, job_sm: int, pod_sm: int, box_sm: int) -> None:
    fake_driver.machine.procs = [
        dict(gpu=0, pid=pids["job"], mem=10 * GIB, sm=job_sm), dict(gpu=1, pid=pids["job"], mem=10 * GIB, sm=job_sm),
        dict(gpu=0, pid=pids["pod"], mem=4 * GIB, sm=pod_sm),
        dict(gpu=2, pid=pids["box"], mem=2 * GIB, sm=box_sm),
    ]
    fake_driver.write()
    time.sleep(FAKE_RELOAD_S)


def two_hosts(cgroup_lab, idle_processes, ssh_lab):
    """Hosts nodea and nodeb of the real-sshd lab: on nodea Slurm job 501 holds both cards at 0 % SM,
    on nodeb job 502 computes (70 %) on its one card. -> (nodea, nodeb)"""
    job, other = idle_processes("sleep", "600"), idle_processes("sleep", "600")
    cgroup_lab.place(cgroup_lab.v2, "system.slice/slurmstepd.scope/job_501/step_0/user/task_0", job.pid)
    cgroup_lab.place(cgroup_lab.v2, "system.slice/slurmstepd.scope/job_502/step_0/user/task_0", other.pid)
    a, b = ssh_lab.host("nodea"), ssh_lab.host("nodeb")
    a.machine.cards = [Card(), Card()]
    a.machine.procs = [dict(gpu=0, pid=job.pid, mem=3 * GIB, sm=0), dict(gpu=1, pid=job.pid, mem=3 * GIB, sm=0)]
    b.machine.cards = [Card()]
    b.machine.procs = [dict(gpu=0, pid=other.pid, mem=5 * GIB, sm=70)]
    a.write()
    b.write()
    return a, b
