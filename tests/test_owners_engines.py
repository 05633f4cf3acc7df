"""Containers no cgroup names, each a real process: an Apptainer (Singularity) container's process
by the image its environment names; a containerd container (nerdctl) by its shim, an ancestor,
and the name nerdctl's name store keeps; the pid a process has in a PID namespace of its own beside
the host's, in `snapshot --json`, the process table and the process screen."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import Card, require_tool
from test_process_screen import open_process
from test_tui import run, started
from test_tui_dialogs import wait_until

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.owners.reader import HostPaths, OwnerReader
from gpumon.tui.app import create_app
from gpumon.tui.widgets.process_table import ProcessTable


def _child_of(proc: subprocess.Popen, command: str) -> int:
    """The pid of `proc`'s child running `command`, once it does."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for child in psutil.Process(proc.pid).children(recursive=True):
            try:
                if child.cmdline()[:1] == [command]:
                    return child.pid
            except psutil.Error:
                pass
        time.sleep(0.02)
    raise AssertionError(f"{command} never started under {proc.pid}")


def test_an_apptainer_process_is_owned_by_its_image(idle_processes):
    apptainer = idle_processes("env", "APPTAINER_CONTAINER=/x/y/img.sif", "sleep", "600")
    singularity = idle_processes("env", "SINGULARITY_CONTAINER=/opt/images/old.simg/", "sleep", "600")
    _wait_for_exec(apptainer.pid, "sleep")
    _wait_for_exec(singularity.pid, "sleep")
    reader = OwnerReader()
    owner = reader.read(apptainer.pid, "root")
    assert (owner.kind, owner.engine, owner.id, owner.name, owner.label) == \
           ("container", "apptainer", "img.sif", "img.sif", "apptainer:img.sif")
    assert reader.read(singularity.pid, "root").label == "singularity:old.simg"


def _wait_for_exec(pid: int, name: str) -> None:
    deadline = time.monotonic() + 10
    while psutil.Process(pid).name() != name:
        assert time.monotonic() < deadline, f"{pid} never became {name}"
        time.sleep(0.01)


def _shim(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """A process that is containerd's shim by its name and arguments, with a container's process
    as its child: (the shim, the child's pid)."""
    shim = tmp_path / "containerd-shim-runc-v2"
    shim.write_text("#!/bin/sh\nsleep 600 &\nwait\n")
    shim.chmod(0o755)
    proc = subprocess.Popen([str(shim), *args], start_new_session=True)
    return proc, _child_of(proc, "sleep")


def _end(proc: subprocess.Popen) -> None:
    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def test_a_nerdctl_container_is_named_from_nerdctl_name_store(tmp_path):
    cid = secrets.token_hex(32)
    names = tmp_path / "nerdctl" / "8c1b2a3d" / "names" / "default"
    names.mkdir(parents=True)
    (names / "llama").write_text(cid)
    (names / "other").write_text(secrets.token_hex(32))
    reader = OwnerReader(HostPaths(nerdctl_dir=tmp_path / "nerdctl"))
    shims = []
    try:
        shims.append(_shim(tmp_path, "-namespace", "default", "-id", cid, "-address", "/run/containerd.sock"))
        owner = reader.read(shims[-1][1], "root")
        assert (owner.kind, owner.engine, owner.id, owner.name, owner.label) == \
               ("container", "nerdctl", cid[:12], "llama", "nerdctl:llama")
        unnamed = secrets.token_hex(32)
        shims.append(_shim(tmp_path, "-namespace", "default", "-id", unnamed))
        assert reader.read(shims[-1][1], "root").label == f"nerdctl:{unnamed[:12]}"
        # Kubernetes' containers are its pods' (their cgroups say which): not nerdctl's.
        shims.append(_shim(tmp_path, "-namespace", "k8s.io", "-id", secrets.token_hex(32)))
        assert reader.read(shims[-1][1], "root").kind == "user"
    finally:
        for proc, _ in shims:
            _end(proc)


@pytest.fixture
def in_own_pid_namespace(idle_processes):
    """An Apptainer-like process alone in a PID namespace of its own (unshare): its host pid."""
    require_tool("unshare")
    if os.geteuid() != 0:
        pytest.skip("a PID namespace needs root here")
    proc = idle_processes("unshare", "--pid", "--fork", "--kill-child", "env", "APPTAINER_CONTAINER=/x/y/img.sif",
                          "sleep", "600")
    return _child_of(proc, "sleep")


def test_the_pid_inside_is_in_the_json_the_table_and_the_process_screen(in_own_pid_namespace, fake_driver):
    pid = in_own_pid_namespace
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=pid, mem=2 << 30, sm=30)]
    fake_driver.write()
    process = json.loads(fake_driver.run("snapshot", "--json").stdout)["gpus"][0]["processes"][0]
    assert (process["pid"], process["container_pid"]) == (pid, 1)
    assert process["owner"]["engine"] == "apptainer" and process["owner"]["name"] == "img.sif"

    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    app = create_app(backend, interval=0.2)

    async def go():
        async with app.run_test(size=(140, 40)) as pilot:
            await started(pilot)
            table = app.main_screen.query_one(ProcessTable)
            await wait_until(pilot, lambda: table.row_count == 1, what="the process")
            assert table.cell_text(0, "pid") == f"{pid} (1)"
            assert table.cell_text(0, "owner") == "apptainer:img.sif"
            screen = await open_process(pilot, pid)
            svg = app.export_screenshot().replace("&#160;", " ")
            assert "Pid in container" in svg and screen.process.container_pid == 1

    try:
        run(go())
    finally:
        backend.close()
