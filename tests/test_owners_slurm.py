"""Owners on a real Slurm (tests/slurm_lab.py): jobs a real user submits, their processes found
with `scontrol listpids` and listed on cards by the fake NVIDIA driver, read by the real sampler.
One holder per job whatever its steps, steps inside it; array tasks named `JOB_TASK` by root and
by another user alike; the job from the environment where no Slurm cgroup exists."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import psutil
import pytest
from conftest import GIB, Card
from slurm_lab import USER, real_slurm  # noqa: F401 - the fixture

from gpumon.alerting.holder_rules import alerted
from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import Sampler
from gpumon.owners.holders import HolderTracker
from gpumon.owners.reader import HostPaths, OwnerReader
from gpumon.owners.records import SlurmArrays
from gpumon.tui.app import create_app
from gpumon.tui.screens.users import UsersScreen

# One real Slurm for the run (its user, node name and cgroups are the machine's): every test of it
# on one pytest-xdist worker, which starts the session fixture once.
pytestmark = pytest.mark.xdist_group("slurm")

FAKE_RELOAD_S = 0.1
ROOT = Path(__file__).resolve().parent.parent

TWO_STEPS = """#!/bin/sh
srun --overlap -n1 sleep 600 &
sleep 600 &
wait
"""


def two_step_job(slurm, fake_driver) -> tuple[str, int, int]:
    """A job with a sleep in its batch step (card 0, 2 GiB) and one in step 0 (card 1, 3 GiB), both at
    0 % SM: (job id, batch pid, step 0 pid)."""
    job = slurm.submit(TWO_STEPS)
    pids = slurm.step_pids(job, "sleep", {"batch", "0"})
    batch, step0 = pids["batch"][0], pids["0"][0]
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=batch, mem=2 * GIB, sm=0), dict(gpu=1, pid=step0, mem=3 * GIB, sm=0)]
    fake_driver.write()
    time.sleep(FAKE_RELOAD_S)
    return job, batch, step0


@pytest.fixture
def slurm(real_slurm):  # noqa: F811 - the fixture imported above
    yield real_slurm
    real_slurm.cancel_all()


def test_a_job_with_a_batch_and_a_numbered_step_is_one_holder(slurm, fake_driver):
    job, batch, step0 = two_step_job(slurm, fake_driver)
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        snapshot = Sampler(backend).collect()
    finally:
        backend.close()
    owners = {p.pid: p.owner for g in snapshot.gpus for p in g.processes}
    assert (owners[batch].id, owners[step0].id) == (f"{job}.batch", f"{job}.0")
    holders = HolderTracker().update(snapshot)
    jobs = [h for h in holders if h.kind == "slurm"]
    assert [(h.id, h.label, h.user, h.cards, h.processes, h.gpu_memory) for h in jobs] == \
           [(job, f"job {job}", USER, (0, 1), 2, 5 * GIB)]
    assert [(s.id, s.label, s.cards) for s in jobs[0].steps] == [(f"{job}.0", "step 0", (1,)),
                                                                 (f"{job}.batch", "step batch", (0,))]
    # The idle rule fires once for the job (its user's row is not alerted while a job names it).
    assert [h.id for h in alerted(holders)] == [job]


def test_the_users_view_and_users_list_the_steps_inside_the_job(slurm, fake_driver, tmp_path):
    job, _, _ = two_step_job(slurm, fake_driver)
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        async with create_app(backend, interval=0.2).run_test(size=(160, 40)) as pilot:
            app = pilot.app
            deadline = time.monotonic() + 20
            while not any(h.kind == "slurm" for h in app.holding) and time.monotonic() < deadline:
                await pilot.pause(0.05)
            await pilot.press("u")
            while not (isinstance(app.screen, UsersScreen) and app.screen.table.row_count == 4) \
                    and time.monotonic() < deadline:
                await pilot.pause(0.05)
            table = app.screen.table
            return [table.cell_text(i, "who") for i in range(table.row_count)]

    try:
        rows = asyncio.run(go())
    finally:
        backend.close()
    # a tree: user -> job -> steps
    assert rows == [USER, f"└ job {job}", "  ├ step 0", "  └ step batch"]
    text = subprocess.run([sys.executable, "-m", "gpumon", "users", "--window", "300ms"], capture_output=True,
                          text=True, timeout=60, env=fake_driver.env)
    assert text.returncode == 0, text.stderr
    who = [line.split()[0:2] for line in text.stdout.splitlines()[1:5]]
    assert who == [[USER, USER], ["job", job], ["step", "0"], ["step", "batch"]]
    indents = [len(line) - len(line.lstrip()) for line in text.stdout.splitlines()[1:5]]
    assert indents == [0, 2, 4, 4]


ARRAY_TASK = """#!/bin/sh
sleep 600
"""


def test_an_array_task_is_job_task_for_root_and_for_another_user(slurm):
    raw = slurm.submit(ARRAY_TASK, "--array=7")
    pid = slurm.step_pids(raw, "sleep", {"batch"})["batch"][0]
    named, own = slurm.run("squeue", "-h", "-j", raw, "-o", "%i %A").split()
    assert (named, own) == (f"{raw}_7", raw)
    assert f"job_{own}/step_batch" in Path(f"/proc/{pid}/cgroup").read_text()
    # root reads the process's environment
    assert OwnerReader().read(pid, USER).id == f"{named}.batch"
    # another user cannot: the cgroup path says the raw id, and Slurm's tools say the rest, asked in
    # the background: the raw id first (no sample waits for scontrol), then the name once it came.
    # (the system's python: this one's may sit where that user cannot go; psutil from this one's)
    code = (f"import sys, time; sys.path[:0] = [{str(ROOT)!r}, {sysconfig.get_paths()['platlib']!r}]\n"
            "from gpumon.cards.procinfo import ProcessEnricher\nfrom gpumon.model import ProcessSample\n"
            "enricher, ids, deadline = ProcessEnricher(), [], time.monotonic() + 20\n"  # inside run()'s 30 s
            "while time.monotonic() < deadline and len(set(ids)) < 2:\n"
            f"    ids.append(enricher.enrich((ProcessSample({pid}, 'compute'),))[0].owner.id)\n"
            "    time.sleep(0.02)\n"
            "print(ids[0], ids[-1])")
    ids = slurm.run("/usr/bin/python3", "-c", code, user="nobody").split()
    if ids != [f"{own}.batch", f"{named}.batch"]:  # say what Slurm answers that user, and how fast
        started = time.monotonic()
        asked = subprocess.run(["runuser", "-u", "nobody", "--", "scontrol", "-o", "show", "job", own], env=slurm.env,
                               capture_output=True, text=True, timeout=30)
        raise AssertionError(f"{ids}; scontrol as nobody: {asked.returncode} in {time.monotonic() - started:.1f} s, "
                             f"{asked.stdout[:200]!r} {asked.stderr[:200]!r}")


def test_without_slurm_cgroups_the_job_is_read_from_the_environment(tmp_path):
    """proctrack/linuxproc and task/affinity make no cgroup: a job's process is told by its
    environment alone (as slurmstepd sets it: the job, the array task, the step)."""
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "34", "SLURM_ARRAY_JOB_ID": "33", "SLURM_ARRAY_TASK_ID": "7",
           "SLURM_STEP_ID": "0", "SLURM_JOB_NAME": "sweep"}
    batch_env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "35"}
    step = subprocess.Popen(["sleep", "600"], env=env)
    batch = subprocess.Popen(["sleep", "600"], env=batch_env)
    try:
        # Until each has exec'd, /proc/PID/environ is still this process's (fork, then execve).
        sleep, deadline = os.path.realpath(shutil.which("sleep")), time.monotonic() + 10
        while any(psutil.Process(p.pid).exe() != sleep for p in (step, batch)):
            assert time.monotonic() < deadline, "sleep did not start"
            time.sleep(0.01)
        reader = OwnerReader()
        # Read again until both say Slurm or 10 s pass: under a loaded machine one read once came
        # back without the environment; the assertion then says what /proc held.
        deadline = time.monotonic() + 10
        while True:
            owner, batch_owner = reader.read(step.pid, "root"), reader.read(batch.pid, "root")
            if owner.kind == batch_owner.kind == "slurm" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        seen = {p.pid: (psutil.Process(p.pid).status(), Path(f"/proc/{p.pid}/environ").read_bytes()[:200])
                for p in (step, batch)}
        assert (owner.kind, owner.id, owner.name) == ("slurm", "33_7.0", "sweep"), seen
        assert (batch_owner.kind, batch_owner.id) == ("slurm", "35"), seen
    finally:
        for p in (step, batch):
            p.terminate()
            p.wait(5)


# A scontrol that never answers (slurmctld down, a hung network): a stand-in for the hang alone;
# the real Slurm above answers the real questions.
HUNG_SCONTROL = """#!/bin/sh
echo $$ > {pidfile}.new && mv {pidfile}.new {pidfile}
exec sleep 3600
"""


# A controller busy for a moment: the first question hangs, later ones answer as scontrol does; a
# job Slurm no longer knows is answered at once (and never asked again).
BUSY_SCONTROL = """#!/bin/sh
echo "$@" >> {asked}
case "$4" in
  777) mkdir {busy} 2>/dev/null && exec sleep 60
       echo "JobId=777 ArrayJobId=776 ArrayTaskId=3 JobName=sweep" ;;
  *) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
esac
"""


def test_an_array_name_that_got_no_answer_is_asked_again(tmp_path):
    """A scontrol that timed out once (slurmctld busy) is asked again, later, and the name comes;
    before, the raw id was kept as the answer for as long as gpumon ran."""
    scontrol, asked = tmp_path / "scontrol", tmp_path / "asked"
    scontrol.write_text(BUSY_SCONTROL.format(asked=asked, busy=tmp_path / "busy"))
    scontrol.chmod(0o755)
    arrays = SlurmArrays(str(scontrol))
    arrays.TIMEOUT_S, arrays.RETRY_S = 0.5, (0.2, 1.0)
    assert (arrays.name("777"), arrays.name("900")) == ("777", "900")  # at once, while asked
    deadline = time.monotonic() + 20
    while arrays.answers < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (arrays.name("777"), arrays.name("900")) == ("776_3", "900")
    assert not arrays.asking("777") and not arrays.asking("900")
    assert asked.read_text().split("\n").count("-o show job 900") == 1
    assert asked.read_text().split("\n").count("-o show job 777") == 2


# A busy controller that answers every question, each in 3 s (within Slurm's MessageTimeout).
SLOW_SCONTROL = """#!/bin/sh
echo "$@" >> {asked}
sleep 3
echo "JobId=777 ArrayJobId=776 ArrayTaskId=3 JobName=sweep"
"""


def test_a_controller_slow_to_answer_names_the_task_on_the_first_question(tmp_path):
    """scontrol waits for slurmctld as long as Slurm's MessageTimeout says (10 s by default); gpumon
    gave it 2 s, so a busy controller's answer was cut off every time (CI: the real-Slurm array
    test got no name in 20 s under four workers)."""
    scontrol, asked = tmp_path / "scontrol", tmp_path / "asked"
    scontrol.write_text(SLOW_SCONTROL.format(asked=asked))
    scontrol.chmod(0o755)
    arrays = SlurmArrays(str(scontrol))
    assert arrays.name("777") == "777"  # at once, while asked
    deadline = time.monotonic() + 20
    while arrays.answers < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert arrays.name("777") == "776_3"
    assert asked.read_text().split("\n").count("-o show job 777") == 1


def _running(pidfile: Path) -> bool:
    try:
        return psutil.Process(int(pidfile.read_text())).status() != psutil.STATUS_ZOMBIE
    except (OSError, ValueError, psutil.Error):
        return False


def test_a_hung_scontrol_delays_no_sample(fake_driver, idle_processes, tmp_path, monkeypatch):
    """Another user's Slurm process (its environment unreadable: here empty, in a /proc whose
    cgroup file names job 777) makes gpumon ask scontrol for the array task's name. While scontrol
    hangs, samples keep coming at the interval, with the job by its raw id."""
    bin_dir, asked = tmp_path / "bin", tmp_path / "scontrol.pid"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(HUNG_SCONTROL.format(pidfile=asked))
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    task = idle_processes("sleep", "600")
    procfs = tmp_path / "hostproc"  # the real /proc, but for that process's cgroup and environment
    procfs.mkdir()
    for entry in os.listdir("/proc"):
        if entry != str(task.pid):
            (procfs / entry).symlink_to(f"/proc/{entry}")
    (procfs / str(task.pid)).mkdir()
    for entry in os.listdir(f"/proc/{task.pid}"):
        if entry not in ("cgroup", "environ"):
            (procfs / str(task.pid) / entry).symlink_to(f"/proc/{task.pid}/{entry}")
    (procfs / str(task.pid) / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0\n")
    (procfs / str(task.pid) / "environ").write_bytes(b"")
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=task.pid, mem=GIB)]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        sampler = Sampler(backend, interval=0.1, owners=HostPaths(procfs=procfs))
        while_hung: list[tuple[float, str]] = []
        deadline = time.monotonic() + 30

        def on_snapshot(snapshot) -> None:
            owners = [p.owner.id for g in snapshot.gpus for p in g.processes if p.owner is not None]
            if not snapshot.stale and _running(asked):
                while_hung.append((snapshot.time, owners))
            if len(while_hung) >= 5 or time.monotonic() > deadline:
                sampler.stop()

        sampler.subscribe(on_snapshot)
        asyncio.run(sampler.run())
    finally:
        backend.close()
    assert len(while_hung) >= 5, while_hung  # before: no sample until scontrol was killed (2 s)
    assert all(owners == ["777.0"] for _, owners in while_hung), while_hung
