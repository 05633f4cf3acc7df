"""A `gpumon.py` or a `gpumon/` package in the directory gpumon is started from (a cloned project, a
shared /tmp, a home directory) never runs in its place: not in the job's supervisor, not in the
children `r`, `x` and J's `s` start, not in a fleet's `local` host. The job runs, in the directory
the user chose, with their environment; the supervisor runs in its job folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from conftest import GIB
from test_jobs import four_cards, wait_for
from test_tui import run, started
from test_tui_host import app_on, wait_until

from gpumon.jobs import files, records
from gpumon.jobs.host import LocalHost
from gpumon.tui.jobs.screen import JobsScreen
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.widgets.process_table import ProcessTable


def hostile_directory(tmp_path: Path, kind: str) -> tuple[Path, Path]:
    """A directory holding code named gpumon that leaves `marker` behind if it is ever imported."""
    where = tmp_path / f"hostile-{kind}"
    where.mkdir()
    marker = tmp_path / f"imported-{kind}"
    payload = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    if kind == "module":
        (where / "gpumon.py").write_text(payload)
    else:
        (where / "gpumon").mkdir()
        (where / "gpumon" / "__init__.py").write_text(payload)
        (where / "gpumon" / "__main__.py").write_text(payload)
        (where / "gpumon" / "jobs").mkdir()
        (where / "gpumon" / "jobs" / "__init__.py").write_text(payload)
        (where / "gpumon" / "jobs" / "supervisor.py").write_text(payload)
    return where, marker


def installed_gpumon(fake_driver, *args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The gpumon command as installed (a console script: no working directory on its path), run there."""
    return subprocess.run([sys.executable, "-P", "-m", "gpumon", *args], cwd=cwd, env=fake_driver.env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("kind", ["module", "package"])
def test_run_from_a_directory_with_a_gpumon_of_its_own(fake_driver, tmp_path, kind):
    four_cards(fake_driver.machine)
    fake_driver.write()
    where, marker = hostile_directory(tmp_path, kind)
    out = tmp_path / "ran"
    result = installed_gpumon(fake_driver, "run", "--interval", "0.2", "--gpu", "2", "--name", "real", "--",
                              "sh", "-c", f"pwd > {out}; exec sleep 30", cwd=where)
    assert result.returncode == 0, result.stderr
    assert "job " in result.stdout and "pid" in result.stdout, result.stdout
    wait_for(lambda: out.exists() and out.read_text(), what="the job to run")
    assert out.read_text().strip() == str(where), "the job runs where it was launched from"
    (job,) = records.list_jobs()
    assert job.state == "running", job.reason
    # The supervisor is in its job folder, not in the directory it was started from.
    supervisor = psutil.Process(job.supervisor_pid)
    assert Path(supervisor.cwd()) == job.dir
    assert not marker.exists(), f"the directory's own gpumon ran: {marker.read_text()!r}"
    stopped = installed_gpumon(fake_driver, "jobs", "--stop", job.spec.id, cwd=where)
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: records.load_job(job.dir).state == "killed", what="the stop")
    assert not marker.exists()


def test_a_fleets_local_host_launches_the_real_gpumon(fake_driver, tmp_path):
    four_cards(fake_driver.machine)
    fake_driver.write()
    where, marker = hostile_directory(tmp_path, "package")
    out = tmp_path / "ran"
    result = installed_gpumon(fake_driver, "--nvml-lib", str(fake_driver.lib), "run", "--host", "local",
                              "--gpu", "3", "--", "sh", "-c", f"echo ok > {out}; exec sleep 30", cwd=where)
    assert result.returncode == 0, result.stderr
    assert wait_for(lambda: out.exists() and out.read_text(), what="the job on local") == "ok\n"
    (job,) = records.list_jobs()
    listed = installed_gpumon(fake_driver, "jobs", "--hosts", "local", "--json", cwd=where)
    assert [j["id"] for j in json.loads(listed.stdout)] == [job.spec.id], listed.stderr
    installed_gpumon(fake_driver, "jobs", "--hosts", "local", "--stop", job.spec.id, cwd=where)
    wait_for(lambda: records.load_job(job.dir).state == "killed", what="the stop")
    assert not marker.exists(), f"the directory's own gpumon ran: {marker.read_text()!r}"


def test_r_x_and_js_s_from_a_directory_with_a_gpumon_of_its_own(fake_driver, idle_processes, tmp_path,
                                                                monkeypatch):
    """The TUI started in that directory, with a relative PYTHONPATH too: its children import the
    gpumon that runs; the job still gets the PYTHONPATH it was launched with."""
    where, marker = hostile_directory(tmp_path, "package")
    monkeypatch.chdir(where)
    monkeypatch.setenv("PYTHONPATH", ".")
    victim = idle_processes()
    fake_driver.machine.procs = [dict(gpu=1, pid=victim.pid, mem=GIB, sm=10)]
    backend, app = app_on(fake_driver)
    probe = tmp_path / "env.json"
    typed = (f"{sys.executable} -c \"import json, os; json.dump([os.getcwd(), os.environ.get('PYTHONPATH')], "
             f"open('{probe}', 'w'))\"; exec sleep 30")

    async def go():
        async with app.run_test(size=(160, 40)) as pilot:
            screen = await started(pilot)
            await pilot.press("r", *typed, "enter")
            await wait_until(pilot, lambda: probe.exists() and probe.stat().st_size, "the job to run")
            assert json.loads(probe.read_text()) == [str(where), "."]
            job = await wait_until(pilot, lambda: [j for j in LocalHost().jobs() if j["state"] == "running"],
                                   "the job")
            await pilot.press("J")
            assert isinstance(app.screen, JobsScreen)
            await wait_until(pilot, lambda: app.screen.selected is not None, "the job in J")
            await pilot.press("s", "y")
            await wait_until(pilot, lambda: records.load_job(files.jobs_dir() / job[0]["id"]).state == "killed",
                             "J's s to stop the job")
            await pilot.press("escape")

            table = screen.query_one(ProcessTable)
            await pilot.press("tab")
            await wait_until(pilot, lambda: table.selected_row is not None and table.selected_row.process.pid
                             == victim.pid, "the victim in the process table")
            await pilot.press("x")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await wait_until(pilot, lambda: victim.poll() is not None, "x to end the process")
            assert victim.returncode == -15

    try:
        run(go())
    finally:
        backend.close()
    assert not marker.exists(), f"the directory's own gpumon ran: {marker.read_text()!r}"
    assert os.environ["PYTHONPATH"] == "."
