"""Processes on AMD and Intel cards from /proc/PID/fdinfo: a fake procfs whose pids are real
processes (their stat, status and cmdline are the real ones), with DRM fds and fdinfo written as
the kernel's drm-usage-stats says."""

from __future__ import annotations

import getpass

from conftest import GIB
from fakedrm import amdgpu_fdinfo

from gpumon.cards.backends.drm import DrmBackend
from gpumon.cards.backends.drm.fdinfo import DrmClients, parse_fdinfo
from gpumon.cards.sampler import Sampler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_client_is_counted_once_however_many_fds_and_busy_is_a_difference(fake_kernel, idle_processes):
    card = fake_kernel.sys.amd()
    trainer, other = idle_processes(), idle_processes()
    proc = fake_kernel.proc
    # The trainer's client 7 through two fds (dup), and a second client of its own; a pipe, a file.
    for fd in (5, 9):
        proc.client(trainer.pid, fd, amdgpu_fdinfo(card.address, 7, vram_kib=1 << 20))
    proc.client(trainer.pid, 11, amdgpu_fdinfo(card.address, 8, vram_kib=512 << 10))
    proc.other_file(trainer.pid, 3, "pipe:[4242]")
    proc.other_file(trainer.pid, 4, "/dev/nvidia0")
    # Another process inherited client 7 (fork): still one client, counted with the first pid seen.
    proc.client(other.pid, 5, amdgpu_fdinfo(card.address, 7, vram_kib=1 << 20))
    clock = Clock()
    drm = DrmBackend(sysfs=str(fake_kernel.sys.root), procfs=str(proc.root), clock=clock)
    sampler = Sampler(drm)
    (gpu,) = sampler.collect().gpus
    by_pid = {p.pid: p for p in gpu.processes}
    first = min(trainer.pid, other.pid)
    assert by_pid[trainer.pid].gpu_memory == (GIB if first == trainer.pid else 0) + (512 << 20)
    assert by_pid[trainer.pid].sm_util is None  # busy % needs two readings
    # What the OS says of it, as for NVIDIA processes (procinfo's enrichment).
    assert by_pid[trainer.pid].user == getpass.getuser() and "time.sleep(600)" in by_pid[trainer.pid].command
    assert by_pid[trainer.pid].type == "compute" and by_pid[trainer.pid].started is not None

    clock.now += 2.0  # client 7 ran 1.5 s on gfx and 0.4 s on compute; client 8 0.5 s of compute
    for fd in (5, 9):
        proc.client(trainer.pid, fd, amdgpu_fdinfo(card.address, 7, 1 << 20, gfx_ns=1_500_000_000,
                                                   compute_ns=400_000_000))
    proc.client(other.pid, 5, amdgpu_fdinfo(card.address, 7, 1 << 20, gfx_ns=1_500_000_000,
                                            compute_ns=400_000_000))
    proc.client(trainer.pid, 11, amdgpu_fdinfo(card.address, 8, 512 << 10, compute_ns=500_000_000))
    (gpu,) = sampler.collect().gpus
    by_pid = {p.pid: p for p in gpu.processes}
    if first == trainer.pid:
        assert by_pid[trainer.pid].sm_util == 75  # gfx 75 %; compute 20 + 25 = 45 %: the busiest engine
        assert other.pid not in by_pid
    else:
        assert by_pid[trainer.pid].sm_util == 25 and by_pid[other.pid].sm_util == 75
    assert by_pid[trainer.pid].cpu_percent is not None


def test_older_amdgpu_keys_and_clients_that_do_not_name_their_device(fake_kernel, idle_processes):
    card = fake_kernel.sys.amd()
    job = idle_processes()
    legacy = amdgpu_fdinfo(card.address, 3, vram_kib=2048, legacy=True)
    without_pdev = "".join(line + "\n" for line in legacy.splitlines() if not line.startswith("drm-pdev"))
    fake_kernel.proc.client(job.pid, 5, without_pdev, node=card.render)
    drm = DrmBackend(sysfs=str(fake_kernel.sys.root), procfs=str(fake_kernel.proc.root), clock=Clock())
    (gpu,) = drm.sample().gpus
    assert [(p.pid, p.gpu_memory) for p in gpu.processes] == [(job.pid, 2 << 20)]
    client = parse_fdinfo(legacy)
    assert client.vram == 2 << 20 and client.engine_ns["gfx"] == 0 and client.pdev == card.address
    assert parse_fdinfo("pos:\t0\nflags:\t02\n") is None  # not a DRM file


def test_a_hosts_proc_mounted_elsewhere(fake_kernel, idle_processes):
    """gpumon in a container: the host's /proc at another path, its fd links naming the host's /dev
    (under the container's view of it), and pids that exist only there (4242 is the host's pid of
    a process; here it stands for a real one)."""
    card = fake_kernel.sys.amd()
    real = idle_processes()
    fake_kernel.proc.client(4242, 5, amdgpu_fdinfo(card.address, 1, vram_kib=4096), dev="/host/dev/dri",
                            real_pid=real.pid)
    out = fake_kernel.snapshot()
    (proc,) = out["gpus"][0]["processes"]
    assert proc["pid"] == 4242 and proc["gpu_memory"] == 4 << 20
    assert "time.sleep(600)" in proc["command"]  # read from the host's /proc, not this one's


def test_fd_lists_are_read_again_only_every_few_seconds(fake_kernel, idle_processes):
    card = fake_kernel.sys.amd()
    early, late = idle_processes(), idle_processes()
    fake_kernel.proc.client(early.pid, 5, amdgpu_fdinfo(card.address, 1, vram_kib=1024))
    fake_kernel.proc.process(late.pid)
    clock = Clock()
    clients = DrmClients(procfs=str(fake_kernel.proc.root), sysfs=str(fake_kernel.sys.root), rescan_s=5.0,
                         clock=clock)
    assert [u.pid for u in clients.read()] == [early.pid]
    scans = clients.fd_scans
    assert scans == 2
    for _ in range(4):  # each second: only the known DRM fds' fdinfo is read
        clock.now += 1.0
        assert [u.pid for u in clients.read()] == [early.pid]
    assert clients.fd_scans == scans
    # A process that opens the card later is seen once its fd list is read again (within 2 x 5 s).
    fake_kernel.proc.client(late.pid, 7, amdgpu_fdinfo(card.address, 2, vram_kib=1024))
    clock.now += 10.0
    assert sorted(u.pid for u in clients.read()) == sorted([early.pid, late.pid])
    # A closed fd is noticed at once; a process gone from /proc is forgotten.
    fake_kernel.proc.close(early.pid, 5)
    clock.now += 1.0
    assert [u.pid for u in clients.read()] == [late.pid]
    fake_kernel.proc.exit(late.pid)
    clock.now += 1.0
    assert clients.read() == [] and clients._pids.keys() == {early.pid}


def test_a_reused_pid_is_looked_at_again(fake_kernel, idle_processes):
    """Another process gets the pid: the fd that was a DRM file is not one any more, so the pid's
    fd list is read again at once, and the new process's own DRM file is found."""
    card = fake_kernel.sys.amd()
    first, second = idle_processes(), idle_processes()
    fake_kernel.proc.client(4000, 5, amdgpu_fdinfo(card.address, 1, vram_kib=1024), real_pid=first.pid)
    clock = Clock()
    clients = DrmClients(procfs=str(fake_kernel.proc.root), sysfs=str(fake_kernel.sys.root), clock=clock)
    assert [(u.pid, u.vram) for u in clients.read()] == [(4000, 1 << 20)]
    fake_kernel.proc.exit(4000)
    fake_kernel.proc.other_file(4000, 5, "/etc/passwd")
    fake_kernel.proc.client(4000, 8, amdgpu_fdinfo(card.address, 2, vram_kib=2048), real_pid=second.pid)
    clock.now += 1.0
    assert clients.read() == []  # fd 5 is the new process's, and not a DRM file
    clock.now += 1.0
    assert [(u.pid, u.vram) for u in clients.read()] == [(4000, 2 << 20)]
