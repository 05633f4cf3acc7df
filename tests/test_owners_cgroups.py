"""Who owns a GPU process, read from real cgroups: real processes moved into Slurm, kubepods (each
QoS class, both cgroup drivers, containerd, CRI-O and Docker scopes), Docker, Podman and systemd
shaped cgroups (v1 and v2), listed on cards by the fake driver, seen in `gpumon snapshot` (JSON
and text) and in the TUI's process table. The kubelet's pod directories, the engines' state and
a scheduler's per-card job files are trees under tmp dirs the config points at."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest
from cgroup_lab import cgroup_lab  # noqa: F401 - the fixture
from conftest import GIB, Card

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.owners.reader import HostPaths
from gpumon.settings import Settings
from gpumon.tui.app import create_app
from gpumon.tui.widgets.process_table import ProcessTable


def hexid(seed: int) -> str:
    return (f"{seed:02x}" * 32)[:64]


def uid(seed: int) -> str:
    h = f"{seed:x}" * 32
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


# (hierarchy, cgroup under the test root, environment, the owner expected but for its user)
SHAPES = {
    # Slurm, v1 and v2, numbered and named steps, an array task told by its environment
    "slurm-v1": ("v1", "slurm/uid_0/job_42/step_0/task_0", {}, ("slurm", "42.0", None, None)),
    "slurm-v1-array": ("v1", "slurm/uid_0/job_43/step_batch", {"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "40",
                                                               "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_NAME": "sweep"},
                       ("slurm", "40_3.batch", "sweep", None)),
    "slurm-v2": ("v2", "system.slice/node1_slurmstepd.scope/job_44/step_0/user/task_0", {},
                 ("slurm", "44.0", None, None)),
    "slurm-v2-extern": ("v2", "system.slice/slurmstepd.scope/job_45/step_extern", {},
                        ("slurm", "45.extern", None, None)),
    # Kubernetes, cgroupfs driver (v1): burstable, guaranteed, besteffort
    "k8s-v1-burstable": ("v1", f"kubepods/burstable/pod{uid(1)}/{hexid(1)}", {},
                         ("k8s", uid(1), "ml/trainer-7f9c (main)", None)),
    "k8s-v1-guaranteed": ("v1", f"kubepods/pod{uid(2)}/{hexid(2)}", {},
                          ("k8s", uid(2), "serving/llm-0 (server)", None)),
    "k8s-v1-besteffort": ("v1", f"kubepods/besteffort/pod{uid(3)}/{hexid(3)}", {}, ("k8s", uid(3), None, None)),
    # Kubernetes, systemd driver (v2): containerd, CRI-O, Docker
    "k8s-v2-containerd": ("v2", f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
                                f"{uid(4).replace('-', '_')}.slice/cri-containerd-{hexid(4)}.scope",
                          {}, ("k8s", uid(4), "ml/notebook-1", None)),
    "k8s-v2-crio": ("v2", "kubepods.slice/kubepods-besteffort.slice/"
                          f"kubepods-besteffort-pod{uid(5).replace('-', '_')}.slice/crio-{hexid(5)}.scope",
                    {}, ("k8s", uid(5), None, None)),
    "k8s-v2-docker": ("v2", f"kubepods.slice/kubepods-pod{uid(6).replace('-', '_')}.slice/docker-{hexid(6)}.scope",
                      {}, ("k8s", uid(6), None, None)),
    # containerd told to use systemd's driver without a systemd (k3s, kind): the spec's path verbatim
    "k8s-v2-colon": ("v2", f"system.slice/containerd.service/kubepods-burstable-pod{uid(11).replace('-', '_')}"
                           f".slice:cri-containerd:{hexid(11)}", {}, ("k8s", uid(11), None, None)),
    # Docker and Podman: cgroupfs (v1) and systemd (v2) drivers
    "docker-v1": ("v1", f"docker/{hexid(7)}", {}, ("container", hexid(7)[:12], "llama", "docker")),
    "podman-v1": ("v1", f"libpod_parent/libpod-{hexid(8)}", {}, ("container", hexid(8)[:12], "whisper", "podman")),
    "docker-v2": ("v2", f"system.slice/docker-{hexid(9)}.scope", {}, ("container", hexid(9)[:12], None, "docker")),
    "podman-v2": ("v2", f"machine.slice/libpod-{hexid(10)}.scope/container", {},
                  ("container", hexid(10)[:12], "whisper-2", "podman")),
    # systemd units, and none of these
    "service": ("v2", "system.slice/ollama.service", {}, ("unit", "ollama.service", None, None)),
    "session": ("v2", "user.slice/user-0.slice/session-3.scope", {}, ("unit", "session-3.scope", None, None)),
    "plain": ("v2", "plain", {}, ("user", "root", None, None)),
    "mapped": ("v2", "plain", {}, ("slurm", "4242", None, None)),  # on the card the job map names
}
MAPPED_CARD = 3


def host_records(root: Path) -> dict[str, Path]:
    """The kubelet's log directories, Docker's and Podman's state, a prolog's job files."""
    pods, links = root / "log" / "pods", root / "log" / "containers"
    for directory in (f"ml_trainer-7f9c_{uid(1)}/main", f"ml_trainer-7f9c_{uid(1)}/init",
                      f"serving_llm-0_{uid(2)}/server", f"ml_notebook-1_{uid(4)}/a", f"ml_notebook-1_{uid(4)}/b"):
        (pods / directory).mkdir(parents=True)
    links.mkdir(parents=True)
    (links / f"trainer-7f9c_ml_main-{hexid(1)}.log").symlink_to(pods / f"ml_trainer-7f9c_{uid(1)}/main/0.log")
    docker = root / "docker"
    (docker / "containers" / hexid(7)).mkdir(parents=True)
    (docker / "containers" / hexid(7) / "config.v2.json").write_text(json.dumps({"ID": hexid(7), "Name": "/llama"}))
    podman = root / "storage"
    (podman / "overlay-containers").mkdir(parents=True)
    (podman / "overlay-containers" / "containers.json").write_text(json.dumps(
        [{"id": hexid(8), "names": ["whisper"]}, {"id": hexid(10), "names": ["whisper-2", "alias"]}]))
    jobs = root / "jobs"
    jobs.mkdir()
    (jobs / str(MAPPED_CARD)).write_text("4242\n")
    return {"pods_dir": pods, "docker_dir": docker, "podman_dir": podman, "job_map_dir": jobs}


@pytest.fixture
def owned(cgroup_lab, idle_processes, fake_driver, tmp_path):  # noqa: F811 - the fixture imported above
    """A process in each shape, on the fake driver's cards; -> (pid by shape, host records)."""
    pids = {}
    for name, (which, relative, environment, _) in SHAPES.items():
        env = ["env", *(f"{k}={v}" for k, v in environment.items())] if environment else []
        proc = idle_processes(*env, "sleep", "600")
        cgroup_lab.place(cgroup_lab.v1 if which == "v1" else cgroup_lab.v2, relative, proc.pid)
        pids[name] = proc.pid
    fake_driver.machine.cards = [Card(), Card(), Card(), Card()]
    fake_driver.machine.procs = [dict(gpu=MAPPED_CARD if name == "mapped" else i % 3, pid=pid, mem=(i + 1) * GIB)
                                 for i, (name, pid) in enumerate(pids.items())]
    # A job's process on the mapped card keeps its own job (its cgroup says which step).
    fake_driver.machine.procs.append(dict(gpu=MAPPED_CARD, pid=pids["slurm-v1"], mem=GIB))
    fake_driver.write()
    return pids, host_records(tmp_path / "host")


def expected(name: str) -> dict:
    kind, ident, label, engine = SHAPES[name][3]
    return {"kind": kind, "id": ident, "name": label, "user": "root", "engine": engine}


def write_config(tmp_path: Path, records: dict[str, Path]) -> Path:
    config = tmp_path / "config.toml"
    config.write_text("[owners]\n" + "".join(f'{key} = "{path}"\n' for key, path in records.items()))
    return config


def test_owners_from_real_cgroups_in_the_snapshot(owned, fake_driver, tmp_path):
    pids, records = owned
    config = write_config(tmp_path, records)
    out = fake_driver.run("snapshot", "--json", "--config", str(config))
    assert out.returncode == 0, out.stderr
    seen = {(gpu["index"], p["pid"]): p["owner"] for gpu in json.loads(out.stdout)["gpus"] for p in gpu["processes"]}
    for name, pid in pids.items():
        card = MAPPED_CARD if name == "mapped" else list(pids).index(name) % 3
        assert seen[card, pid] == expected(name), name
    assert seen[MAPPED_CARD, pids["slurm-v1"]] == expected("slurm-v1")

    text = fake_driver.run("snapshot", "--config", str(config))
    assert text.returncode == 0, text.stderr
    assert "OWNER" in text.stdout.splitlines()[-len(seen) - 1]
    for label in ("job 42.0", "job 40_3.batch", "ml/trainer-7f9c (main)", "docker:llama", f"docker:{hexid(9)[:12]}",
                  "podman:whisper", "ollama.service", "session-3.scope", "job 4242"):
        assert f"  {label}  " in text.stdout, label

    # Without the host's records, the ids are still there: the names are not.
    bare = fake_driver.run("snapshot", "--json")
    owner = next(p["owner"] for gpu in json.loads(bare.stdout)["gpus"] for p in gpu["processes"]
                 if p["pid"] == pids["k8s-v1-burstable"])
    assert owner == dict(expected("k8s-v1-burstable"), name=None)


def test_the_process_table_shows_filters_and_sorts_by_owner(owned, fake_driver):
    pids, records = owned
    settings = Settings(host_paths=HostPaths(**records))
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        async with create_app(backend, interval=0.3, settings=settings).run_test(size=(180, 50)) as pilot:
            table = pilot.app.main_screen.query_one(ProcessTable)
            await rows_shown(pilot, table, len(pids) + 1)
            owner_of = {int(table.cell_text(i, "pid")): table.cell_text(i, "owner") for i in range(table.row_count)}
            assert owner_of[pids["slurm-v1"]] == "job 42.0"
            assert owner_of[pids["k8s-v1-burstable"]] == "ml/trainer-7f9c (main)"
            assert owner_of[pids["k8s-v2-crio"]] == f"pod {uid(5)[:8]}"
            assert owner_of[pids["podman-v2"]] == "podman:whisper-2"
            assert owner_of[pids["service"]] == "ollama.service"
            assert owner_of[pids["plain"]] == "root"
            assert owner_of[pids["mapped"]] == "job 4242"
            assert "OWNER" in line_text(table, 0) and "COMMAND" in line_text(table, 0)

            await pilot.press("tab")
            for _ in range(10):
                if table.sort_key == "owner":
                    break
                await pilot.press("s")
            assert table.sort_key == "owner"
            await pilot.pause(0.5)
            owners_shown = [table.cell_text(i, "owner") for i in range(table.row_count)]
            assert owners_shown == sorted(owners_shown)
            assert table.header_label("owner") == "OWNER▲"

            await pilot.press("escape", "slash", *"job 4")
            await pilot.pause(0.6)
            shown = {int(table.cell_text(i, "pid")) for i in range(table.row_count)}
            assert shown == {pids[n] for n in ("slurm-v1", "slurm-v1-array", "slurm-v2", "slurm-v2-extern", "mapped")}

    try:
        asyncio.run(go())
    finally:
        backend.close()


async def rows_shown(pilot, table: ProcessTable, count: int, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while table.row_count < count:
        assert time.monotonic() < deadline, f"{table.row_count} rows shown, not {count}"
        await pilot.pause(0.05)


def line_text(table: ProcessTable, y: int) -> str:
    return "".join(segment.text for segment in table.render_line(y))


def test_a_narrow_table_narrows_then_leaves_out_the_owner_before_the_command():
    from gpumon.cards.backends.demo import DemoBackend

    def row(table, pid):
        return next(line_text(table, y) for y in range(1, table.row_count + 1) if f" {pid} " in line_text(table, y))

    async def go():
        async with create_app(DemoBackend("hot"), interval=0.2).run_test(size=(160, 40)) as pilot:
            table = pilot.app.main_screen.query_one(ProcessTable)
            await rows_shown(pilot, table, 2)
            await pilot.pause(0.3)
            assert "OWNER" in line_text(table, 0) and "COMMAND" in line_text(table, 0)
            assert "  ml/eval-5b8d4 (eval)  " in row(table, 7002)
            assert "  ml/pretrain-7f9c6d-x2x4q (train…  torchrun --nproc 1 pretrain.py" in row(table, 7001)
            await pilot.resize_terminal(120, 40)  # room for part of the owner: cut, the command keeps its room
            await pilot.pause(0.5)
            assert "OWNER" in line_text(table, 0)
            assert "  ml/pretrain-7f9c6d-x2x4q (…  torchrun --nproc 1 pret…" in row(table, 7001)
            await pilot.resize_terminal(80, 24)
            await pilot.pause(0.5)
            assert "OWNER" not in line_text(table, 0) and "COMMAND" in line_text(table, 0)
            assert "ml/" not in row(table, 7001) and row(table, 7001).rstrip().endswith("2h00m  torchrun --n…")
            await pilot.resize_terminal(160, 40)
            await pilot.pause(0.5)
            assert "OWNER" in line_text(table, 0)

    asyncio.run(go())


def test_path_procfs_is_where_processes_are_read(idle_processes, fake_driver, tmp_path):
    """--path.procfs: the owner, the user and the per-sample reads all come from that /proc (here a
    copy of the real one that says a process is in a Slurm job, and that lacks another process)."""
    shown, hidden = idle_processes("sleep", "600"), idle_processes("sleep", "600")
    proc = tmp_path / "hostproc"
    proc.mkdir()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            (proc / entry).symlink_to(f"/proc/{entry}")
    (proc / str(shown.pid)).mkdir()
    for entry in os.listdir(f"/proc/{shown.pid}"):
        if entry != "cgroup":
            (proc / str(shown.pid) / entry).symlink_to(f"/proc/{shown.pid}/{entry}")
    (proc / str(shown.pid) / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0\n")
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=shown.pid, mem=GIB), dict(gpu=0, pid=hidden.pid, mem=GIB)]
    fake_driver.write()
    out = fake_driver.run("--path.procfs", str(proc), "snapshot", "--json")
    assert out.returncode == 0, out.stderr
    processes = {p["pid"]: p for p in json.loads(out.stdout)["gpus"][0]["processes"]}
    assert processes[shown.pid]["owner"] == {"kind": "slurm", "id": "777.0", "name": None, "user": "root",
                                             "engine": None}
    assert processes[shown.pid]["command"] == "sleep 600"
    assert processes[hidden.pid]["owner"] is None and processes[hidden.pid]["user"] is None

    bad = fake_driver.run("snapshot", "--path.procfs", str(tmp_path / "nothing"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "--path.procfs" in bad.stderr



def test_a_remote_host_sends_its_processes_owners(cgroup_lab, idle_processes, ssh_lab):  # noqa: F811
    """Over ssh (the fleet's stream), the remote gpumon reads its own cgroups and this one shows
    them: in `snapshot --hosts` (JSON and text)."""
    job, pod = idle_processes("sleep", "600"), idle_processes("sleep", "600")
    cgroup_lab.place(cgroup_lab.v2, "system.slice/slurmstepd.scope/job_88/step_2/user/task_0", job.pid)
    cgroup_lab.place(cgroup_lab.v1, f"kubepods/burstable/pod{uid(11)}/{hexid(11)}", pod.pid)
    host = ssh_lab.host("gpu01")
    host.machine.cards = [Card(), Card()]
    host.machine.procs = [dict(gpu=0, pid=job.pid, mem=GIB), dict(gpu=1, pid=pod.pid, mem=GIB)]
    host.write()
    result = ssh_lab.gpumon("snapshot", "--json", "--hosts", "gpu01")
    assert result.returncode == 0, result.stderr
    (remote,) = json.loads(result.stdout)["hosts"]
    owners_seen = {p["pid"]: p["owner"] for gpu in remote["snapshot"]["gpus"] for p in gpu["processes"]}
    assert owners_seen == {job.pid: {"kind": "slurm", "id": "88.2", "name": None, "user": "root", "engine": None},
                           pod.pid: {"kind": "k8s", "id": uid(11), "name": None, "user": "root", "engine": None}}
    text = ssh_lab.gpumon("snapshot", "--hosts", "gpu01")
    assert "  job 88.2  " in text.stdout and f"  pod {uid(11)[:8]}  " in text.stdout
