"""What the OS says about GPU processes: a process on several cards is read once per sample and
shown on each card with that card's memory; a command line that changes (setproctitle) is seen."""

from __future__ import annotations

import sys
import time

from conftest import GIB, Card

from gpumon.cards import procinfo
from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import Sampler


def sampler_for(fake_driver) -> tuple[Sampler, NvmlBackend]:
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    return Sampler(backend, interval=0.5), backend


def test_a_process_on_two_cards_has_its_cpu_on_both(fake_driver, idle_processes):
    busy = idle_processes(sys.executable, "-c", "while True: pass")  # a data-parallel job's process
    fake_driver.machine.cards = [Card(), Card(), Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=busy.pid, mem=3 * GIB), dict(gpu=1, pid=busy.pid, mem=5 * GIB)]
    sampler, backend = sampler_for(fake_driver)
    try:
        sampler.collect()
        time.sleep(1.0)
        snap = sampler.collect()
    finally:
        backend.close()
    on0, on1 = snap.gpus[0].processes[0], snap.gpus[1].processes[0]
    assert on0.pid == on1.pid == busy.pid
    assert (on0.gpu_memory, on1.gpu_memory) == (3 * GIB, 5 * GIB)  # each card's own memory
    assert on0.cpu_percent > 20 and on1.cpu_percent == on0.cpu_percent
    assert on0.command == on1.command and on0.started == on1.started
    assert snap.gpus[2].processes == ()


# After 0.8 s the process becomes another program: the same pid and start time, a new command
# line. (Its title is put together at run time, so the old command line does not contain it.)
SCRIPT = """
import os, sys, time
time.sleep(0.8)
os.execv({target!r}, {argv})
"""
TO_SLEEP = SCRIPT.format(target="/bin/sleep", argv='["/bin/sleep", "6" + "00"]')
TO_RAY_WORKER = SCRIPT.format(
    target=sys.executable,
    argv=f'[{sys.executable!r}, "-c", "import time; time.sleep(600)", "ray::" + "TrainWorker"]')


def test_a_new_command_line_is_seen_when_the_name_changes(fake_driver, idle_processes):
    # Like setproctitle: the kernel's name for the process changes with its command line.
    child = idle_processes(sys.executable, "-c", TO_SLEEP)
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=child.pid, mem=GIB)]
    sampler, backend = sampler_for(fake_driver)
    try:
        first = sampler.collect().gpus[0].processes[0]
        time.sleep(1.5)
        sampler.collect()
        later = sampler.collect().gpus[0].processes[0]
    finally:
        backend.close()
    assert "execv" in first.command
    assert "sleep 600" not in first.command
    assert later.command == "/bin/sleep 600" and later.started == first.started


def test_a_new_command_line_under_the_same_name_is_seen_within_the_refresh(fake_driver, idle_processes,
                                                                           monkeypatch):
    # Ray and vLLM workers retitle themselves without changing the executable's name.
    monkeypatch.setattr(procinfo, "COMMAND_REFRESH_S", 1.0, raising=False)
    child = idle_processes(sys.executable, "-c", TO_RAY_WORKER)
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=child.pid, mem=GIB)]
    sampler, backend = sampler_for(fake_driver)
    try:
        first = sampler.collect().gpus[0].processes[0]
        deadline = time.monotonic() + 10
        later = first
        while "ray::TrainWorker" not in (later.command or "") and time.monotonic() < deadline:
            time.sleep(0.3)
            later = sampler.collect().gpus[0].processes[0]
    finally:
        backend.close()
    assert "execv" in first.command and "ray::TrainWorker" not in first.command
    assert later.command.endswith("ray::TrainWorker")


def test_command_lines_are_not_read_every_sample(fake_driver, idle_processes, monkeypatch):
    # The cheap path: an unchanged process costs no command-line read per sample.
    child = idle_processes(sys.executable, "-c", "import time; time.sleep(600)")
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=child.pid, mem=GIB)]
    reads = []
    real = procinfo._command_line
    monkeypatch.setattr(procinfo, "_command_line", lambda proc: reads.append(proc.pid) or real(proc))
    sampler, backend = sampler_for(fake_driver)
    try:
        for _ in range(10):
            sampler.collect()
    finally:
        backend.close()
    assert reads == [child.pid]


ODD_NAME = """
import time
open("/proc/self/comm", "w").write("we) ird (name")  # a name with the stat file's own delimiters
x = bytearray(64 << 20)  # resident memory worth checking
for i in range(len(x) // 4096):
    x[i * 4096] = 1
time.sleep(600)
"""


def test_the_stat_file_says_what_psutil_says(idle_processes):
    """The per-sample reading (one read of /proc/PID/stat) agrees with psutil's own calls."""
    import os

    import psutil

    child = idle_processes(sys.executable, "-c", ODD_NAME)
    proc = psutil.Process(child.pid)
    deadline = time.monotonic() + 10
    while proc.name() != "we) ird (name" and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    stat = procinfo._read_stat(child.pid)
    times, rss = proc.cpu_times(), proc.memory_info().rss
    assert stat.name == proc.name() == "we) ird (name"
    assert abs(stat.cpu_s - (times.user + times.system)) < 0.05
    assert abs(stat.rss - rss) < (1 << 20) and stat.rss > 64 << 20
    started = psutil.boot_time() + stat.start_ticks / os.sysconf("SC_CLK_TCK")
    assert abs(started - proc.create_time()) < 0.05
    child.kill()
    child.wait()
    assert procinfo._read_stat(child.pid) is None


def test_a_reused_pid_is_read_as_a_new_process(idle_processes):
    """Another process under a known pid (its start differs): user, command and start are read
    afresh, and its CPU % is unknown until its second reading."""
    enricher = procinfo.ProcessEnricher()
    child = idle_processes()
    first = enricher._read(child.pid)
    assert first is not None and first.cpu_percent is None
    assert enricher._read(child.pid).cpu_percent is not None
    enricher._known[child.pid].start_ticks -= 1  # as if an older process had had this pid
    enricher._known[child.pid].command = "the old process"
    again = enricher._read(child.pid)
    assert again.cpu_percent is None and "sleep" in again.known.command
