"""The users view (`u`): who holds the cards, per user and per Slurm job / pod / container, read by
the real NVML backend from the fake driver, with real processes in real cgroups (tests/cgroup_lab.py):
rows for the user and its jobs, a job that stops computing shown idle (its idle time counted from
before the view was opened, and growing), then computing again; hostile names shown literally;
the card panel naming its job; the fleet's view over a real sshd; `gpumon --demo` in tmux."""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shlex
import subprocess
import sys
import time

import pytest
from cgroup_lab import cgroup_lab  # noqa: F401 - the fixture
from conftest import GIB, Card, add_suite_user, end_users_processes
from holders_lab import two_hosts

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.owners.reader import HostPaths
from gpumon.sanitize import printable
from gpumon.settings import Settings
from gpumon.tui.app import create_app
from gpumon.tui.screens.main import MainScreen
from gpumon.tui.screens.users import UsersScreen
from gpumon.tui.widgets.card_list import CardList
from gpumon.tui.widgets.holder_table import HolderTable

POD = "0a0a0a0a-1b1b-2c2c-3d3d-4e4e4e4e4e4e"
CONTAINER = "ab" * 32
HOSTILE = "[b]evil[/b] \x1b[31mred"  # a container's name: markup and an escape sequence, shown as text
FAKE_RELOAD_S = 0.1


@pytest.fixture
def held(cgroup_lab, idle_processes, fake_driver, tmp_path):  # noqa: F811 - the fixture above
    """Slurm job 77 on cards 0 and 1, a pod on card 0, a Docker container (hostile name) on card 2."""
    job, pod, box = (idle_processes("sleep", "600") for _ in range(3))
    cgroup_lab.place(cgroup_lab.v2, "system.slice/slurmstepd.scope/job_77/step_0/user/task_0", job.pid)
    cgroup_lab.place(cgroup_lab.v2, f"kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/"
                                    f"cri-containerd-{'cd' * 32}.scope", pod.pid)
    cgroup_lab.place(cgroup_lab.v1, f"docker/{CONTAINER}", box.pid)
    docker = tmp_path / "docker"
    (docker / "containers" / CONTAINER).mkdir(parents=True)
    (docker / "containers" / CONTAINER / "config.v2.json").write_text(json.dumps({"Name": "/" + HOSTILE}))
    settings = Settings(host_paths=HostPaths(docker_dir=docker))
    fake_driver.machine.cards = [Card(extra={"power_mw": 300_000}), Card(extra={"power_mw": 200_000}),
                                 Card(extra={"power_mw": 100_000})]
    pids = {"job": job.pid, "pod": pod.pid, "box": box.pid}
    set_load(fake_driver, pids, job_sm=60)
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    yield pids, backend, settings
    backend.close()


def set_load(fake_driver, pids, job_sm: int) -> None:
    fake_driver.machine.procs = [
        dict(gpu=0, pid=pids["job"], mem=10 * GIB, sm=job_sm), dict(gpu=1, pid=pids["job"], mem=10 * GIB, sm=job_sm),
        dict(gpu=0, pid=pids["pod"], mem=4 * GIB, sm=20),
        dict(gpu=2, pid=pids["box"], mem=2 * GIB, sm=30),
    ]
    fake_driver.write()
    time.sleep(FAKE_RELOAD_S)


def screen_lines(table: HolderTable) -> list[str]:
    return [table.render_line(y).text for y in range(table.row_count + 1)]


async def until(pilot, condition, what: str, within: float = 30.0):
    deadline = time.monotonic() + within
    while not (result := condition()):
        assert time.monotonic() < deadline, f"never: {what}"
        await pilot.pause(0.05)
    return result


def row(table: HolderTable, label: str):
    """The holder on the row whose WHO cell names `label` (None if none does)."""
    for i in range(table.row_count):
        if table.cell_text(i, "who").lstrip("├└ ") == label:
            return i, table.holder_at(i)
    return None


def test_u_shows_users_and_their_jobs_a_job_goes_idle_its_time_grows_and_it_computes_again(held, fake_driver):
    pids, backend, settings = held

    async def go():
        async with create_app(backend, interval=0.2, settings=settings).run_test(size=(160, 40)) as pilot:
            app = pilot.app
            await until(pilot, lambda: app.sampler.latest is not None and app.holding, "a first reading")
            stopped_at = time.time()
            set_load(fake_driver, pids, job_sm=0)
            # The app counts idle time from every reading, before the view is opened.
            await until(pilot, lambda: any(h.label == "job 77" and h.idle for h in app.holding), "the job idle")
            await pilot.pause(1.2)
            await pilot.press("u")
            screen = await until(pilot, lambda: isinstance(app.screen, UsersScreen) and app.screen, "the view")
            table = screen.table
            await until(pilot, lambda: table.row_count == 4, "a row per user and per job/pod/container")
            assert table.cell_text(0, "who") == "root" and table.holder_at(0).kind == "user"
            # Under the user, its container, pod and job, as a tree.
            assert [table.cell_text(i, "who") for i in range(1, 4)] == \
                   [f"├ docker:{printable(HOSTILE)}", "├ pod 0a0a0a0a", "└ job 77"]
            lines = screen_lines(table)
            assert "WHO" in lines[0] and "IDLE" in lines[0] and "ENERGY" in lines[0] and "HOST" not in lines[0]
            # The hostile name is text: its brackets and escape shown as they are, never styled.
            box_line = next(line for line in lines if "docker:" in line)
            assert f"docker:{printable(HOSTILE)}"[:38] in box_line and "\x1b" not in box_line

            index, job = row(table, "job 77")
            assert job.idle and job.idle_s >= 1.0 and job.idle_s <= time.time() - stopped_at + 1.0  # one sample's slack
            assert table.cell_text(index, "mark") == "!" and table.cell_text(index, "idle")
            assert (table.cell_text(index, "cards"), table.cell_text(index, "mem"), table.cell_text(index, "sm")) \
                == ("0,1", "20G", "0")
            root = table.holder_at(0)
            assert not root.idle and table.cell_text(0, "idle") == "" and table.cell_text(0, "mark") == ""
            summary = screen.line.shown[0].plain
            assert "1 holder idle: job 77 (root) idle " in summary and "holding 20G on 2 cards" in summary
            first = job.idle_s
            await until(pilot, lambda: row(table, "job 77")[1].idle_s >= first + 1.0, "idle time growing")

            # Sorting by idle time puts the idle job first under its user.
            while table.sort_key != "idle":
                await pilot.press("s")
            await pilot.pause(0.3)
            assert table.header_label("idle") == "IDLE▼" and table.cell_text(1, "who") == "├ job 77"

            set_load(fake_driver, pids, job_sm=45)
            await until(pilot, lambda: not row(table, "job 77")[1].idle, "the job computing again")
            index, job = row(table, "job 77")
            assert table.cell_text(index, "mark") == "" and table.cell_text(index, "idle") == ""
            assert table.cell_text(index, "sm") == "90"  # 45 % on each of its two cards
            await until(pilot, lambda: "nobody holds a card idle" in screen.line.shown[0].plain, "no one idle")

            # / filters (its user stays as the rows' context); Esc clears, then goes back.
            await pilot.press("slash", *"pod")
            await until(pilot, lambda: table.row_count == 2, "only the pod and its user")
            assert table.cell_text(1, "who") == "└ pod 0a0a0a0a"
            await pilot.press("escape")
            await until(pilot, lambda: table.row_count == 4, "every row again")
            await pilot.press("escape")
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "back on the main screen")
            await pilot.press("u")
            await until(pilot, lambda: isinstance(app.screen, UsersScreen), "the view again")
            await pilot.press("u")
            await until(pilot, lambda: isinstance(app.screen, MainScreen), "u goes back too")

            # The card panel names the job that holds the whole card, and no one where two share it.
            panels = app.main_screen.query_one(CardList).panels
            assert "job 77" in panels[1].render_line(0).text
            assert "job 77" not in panels[0].render_line(0).text

    asyncio.run(go())


def test_the_fleet_view_lists_every_hosts_holders_with_a_host_column(cgroup_lab, idle_processes, ssh_lab,  # noqa: F811
                                                                     tmux_session, tmp_path):
    """`gpumon --hosts a,b` over a real sshd, `u`: each host's users and jobs, named by host; a job
    at 0 % SM shown idle with its host in the summary."""
    two_hosts(cgroup_lab, idle_processes, ssh_lab)
    from test_fleet_tui_ssh import quit_tui, start_tui

    tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "nodea,nodeb", size=(150, 30))
    tmux.wait_for(lambda s: "2 hosts: 2 live" in s, timeout=60, what="both hosts live")
    tmux.keys("u")
    screen = tmux.wait_for(lambda s: "job 502" in s and "job 501" in s and "HOST" in s, timeout=30,
                           what="both hosts' jobs")
    lines = screen.splitlines()
    job_a = next(line for line in lines if "job 501" in line)
    job_b = next(line for line in lines if "job 502" in line)
    assert "nodea" in job_a and "0,1" in job_a and "6.0G" in job_a and "!" in job_a.split("nodea")[0]
    assert "nodeb" in job_b and "5.0G" in job_b and "70" in job_b and "!" not in job_b
    assert sum(1 for line in lines if " root " in f" {line} ") >= 2  # the user's row on each host
    screen = tmux.wait_for(lambda s: "holder idle: nodea: root idle" in s or "holders idle: nodea: root idle" in s,
                           what="the idle holder named with its host")
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "2 hosts: 2 live" in s, what="back on the overview")
    quit_tui(tmux, status)


def test_demo_in_a_real_terminal_shows_an_idle_holder(tmux_session, tmp_path):
    status = tmp_path / "status"
    tmux = tmux_session(130, 30)
    tmux.start(f"env TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --demo --interval 0.5; "
               f"echo $? > {status}")
    tmux.wait_for(lambda s: "jupyter-kernel" in s, what="the demo's processes")
    tmux.keys("u")
    screen = tmux.wait_for(lambda s: "WHO" in s and "1 holder idle: bob idle" in s, what="the users view")
    assert "└ job 4242" in screen and "docker:vllm-mistral" in screen
    bob = next(line for line in screen.splitlines() if " bob " in line and "9.2G" in line and "idle:" not in line)
    assert bob.lstrip("│ ").startswith("!")
    tmux.keys("q")
    tmux.wait_for(lambda s: "jupyter-kernel" in s, what="back on the main screen")
    tmux.keys("q")
    deadline = time.monotonic() + 20
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.read_text().strip() == "0"



@pytest.fixture
def long_named_user():
    """A real user with a 20-character name (what a site's naming scheme gives): its idle process."""
    if os.geteuid() != 0:
        pytest.skip("making users needs root")
    name = f"gpumonidle{secrets.token_hex(5)}"
    add_suite_user(name, "--no-create-home", "--shell", "/bin/sh")
    sleeper = subprocess.Popen(["sleep", "600"], user=name, cwd="/")
    try:
        yield name, sleeper.pid
    finally:
        sleeper.kill()
        sleeper.wait()
        end_users_processes(name)
        subprocess.run(["userdel", name], capture_output=True)


@pytest.mark.parametrize("fleet", [False, True], ids=["this-machine", "hosts-local"])
def test_at_80_columns_this_machines_idle_holder_is_shown_alike_alone_and_in_the_fleet(
        fake_driver, long_named_user, tmux_session, fleet):
    """`gpumon` and `gpumon --hosts local` over the same driver: the same holder, marked idle, with
    its IDLE time (the fleet's HOST column takes room the single machine's view does not need)."""
    name, pid = long_named_user
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=pid, mem=3 * GIB, sm=0)]
    fake_driver.write()
    keep = ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "TZ", "XDG_CONFIG_HOME", "XDG_STATE_HOME",
            "XDG_DATA_HOME", "GPUMON_CLAIMS_DIR", "GPUMON_SYSTEM_CONFIG")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items() if k in keep)
    tmux = tmux_session(80, 24)
    hosts = "--hosts local " if fleet else ""
    tmux.start(f"env -i {env} TERM=xterm-256color LANG=C.UTF-8 {shlex.quote(sys.executable)} -m gpumon {hosts}"
               f"--interval 0.5; sleep 600")
    tmux.wait_for(lambda s: "live" in s if fleet else "3.0G" in s, timeout=30, what="the first reading")
    tmux.keys("u")
    screen = tmux.wait_for(lambda s: "WHO" in s and "1 holder idle" in s, timeout=30, what="an idle holder")
    header = next(line for line in screen.splitlines() if "WHO" in line)
    assert "IDLE" in header, screen
    holder = next(line for line in screen.splitlines() if "3.0G" in line and "idle:" not in line)
    assert holder.lstrip("│ ").startswith("!"), screen
    assert re.search(r"\d+s\s+│$", holder.rstrip()), screen  # its idle time, in the IDLE column
