"""The single-machine TUI acts on this machine through the host interface (jobs/host.py), as the
fleet acts on any host: `r` launches, `x` signals, J lists and J's `s` stops through the screen's
Host. Given another host, the same keys act there, and a job `r` launches here is the job
`LocalHost.launch` would start."""

from __future__ import annotations

import time

from conftest import GIB, Card
from test_tui import run, started

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.jobs import command_history, files, records
from gpumon.jobs.host import LocalHost, host_at
from gpumon.jobs.launch import shell_request
from gpumon.remote.hosts import parse_hosts
from gpumon.remote.ssh import SshTransport
from gpumon.tui.app import create_app
from gpumon.tui.jobs.screen import JobsScreen
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.widgets.process_table import ProcessTable

CARDS = [Card("NVIDIA A10", uuid=f"GPU-a10a10a{i}-0000-1111-2222-333344445555", mem_total=24 * GIB,
              extra=dict(cpus="0-1")) for i in range(2)]
PER_JOB = {"id", "pid", "started", "ended", "log", "created", "runtime", "attempts", "peak_gpu_memory"}


def same(job: dict) -> dict:
    """What two launches of one request share: all but what each start makes its own."""
    return {k: v for k, v in job.items() if k not in PER_JOB}


async def wait_until(pilot, predicate, what: str, seconds: float = 60.0):
    deadline = time.monotonic() + seconds
    while not (result := predicate()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await pilot.pause(0.2)
    return result


def app_on(fake_driver, cards=CARDS):
    fake_driver.machine.cards = list(cards)
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    return backend, create_app(backend, interval=0.2, backend_args={"nvml_lib": str(fake_driver.lib)})


def test_r_x_and_stop_here_go_through_this_machines_host(fake_driver, idle_processes, tmp_path):
    victim = idle_processes()
    fake_driver.machine.procs = [dict(gpu=1, pid=victim.pid, mem=GIB, sm=10)]
    backend, app = app_on(fake_driver)
    local = LocalHost(["--nvml-lib", str(fake_driver.lib)])
    typed = f"echo here > {tmp_path / 'out'}; exec sleep 30"

    async def go():
        async with app.run_test(size=(160, 40)) as pilot:
            screen = await started(pilot)
            assert isinstance(screen.target, LocalHost)
            assert screen.target.env == screen.env, "children get the environment gpumon started with"
            await pilot.press("r", *typed, "enter")
            job = await wait_until(pilot, lambda: [j for j in local.jobs() if j["state"] == "running"], "the job")
            # The same request through LocalHost.launch: the same job, field for field.
            said = local.launch(shell_request(typed, CARDS[0].uuid))
            twin = [j for j in local.jobs() if j["id"] == said.split()[1]]
            assert same(job[0]) == same(twin[0]) and same(job[0])["command"] == ["/bin/sh", "-c", typed]
            assert command_history.command_history()[-1] == typed, "the history keeps the line as typed"

            await pilot.press("J")
            assert isinstance(app.screen, JobsScreen) and app.screen.host is screen.target
            while app.screen.selected is None or app.screen.selected["id"] != job[0]["id"]:
                await pilot.press("down")
            await pilot.press("s", "y")
            await wait_until(pilot, lambda: records.load_job(files.jobs_dir() / job[0]["id"]).state == "killed",
                             "J's s to stop the job")
            local.stop(twin[0]["id"])
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


def test_given_another_host_the_same_keys_act_there(fake_driver, ssh_lab, monkeypatch):
    """The screen does not know which host it holds: with a fleet host's, `r` launches there."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(ssh_lab.runtime_dir))
    lab = ssh_lab.host("h")
    lab.machine.cards = list(CARDS)
    lab.write()
    (spec,) = parse_hosts("h")
    there = host_at(spec, SshTransport(ssh_lab.ssh, ssh_lab.remote_gpumon))
    backend, app = app_on(fake_driver)

    async def go():
        async with app.run_test(size=(160, 40)) as pilot:
            screen = await started(pilot)
            screen.target = there
            await pilot.press("r", *"exec sleep 30", "enter")
            job = await wait_until(pilot, lambda: [j for j in there.jobs() if j["state"] == "running"], "the job on h")
            assert (job[0]["host"], job[0]["gpus"], job[0]["command"]) == ("h", [CARDS[0].uuid],
                                                                           ["/bin/sh", "-c", "exec sleep 30"])
            assert records.list_jobs() == [], "nothing was launched here"
            await pilot.press("J")  # J lists the jobs of the screen's host too
            assert isinstance(app.screen, JobsScreen)
            await wait_until(pilot, lambda: [(j["host"], j["id"]) for j in app.screen.jobs] == [("h", job[0]["id"])],
                             "J to list the job on h")
            await pilot.press("escape")
            there.stop(job[0]["id"])

    try:
        run(go())
    finally:
        backend.close()


def test_a_job_r_launches_samples_at_the_tuis_interval(fake_driver):
    """Its supervisor (watchdog, failover, energy) reads the cards as often as the TUI it came from
    was asked to (`--interval`), not at gpumon's default."""
    backend, app = app_on(fake_driver)  # --interval 0.2
    local = LocalHost(["--nvml-lib", str(fake_driver.lib)])

    async def go():
        async with app.run_test(size=(160, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", *"exec sleep 30", "enter")
            (job,) = await wait_until(pilot, lambda: [j for j in local.jobs() if j["state"] == "running"], "the job")
            assert records.load_job(files.jobs_dir() / job["id"]).spec.interval == 0.2
            local.stop(job["id"])

    try:
        run(go())
    finally:
        backend.close()
