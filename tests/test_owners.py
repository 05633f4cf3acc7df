"""Who owns a process, piece by piece: the cgroup path parser over real-world /proc/PID/cgroup lines
(v1 and v2, every shape Slurm, the kubelet, Docker, Podman and systemd make, and lines that are
none of them), the host's records (pod log directories, engine state, a job's environment, the
per-card job files), and the owner object in the JSON, recordings and the fleet's stream.
tests/test_owners_cgroups.py does the same with real cgroups and real processes."""

from __future__ import annotations

import json
import os

import pytest

from gpumon.fleet.schema import SchemaError, snapshot_from_remote
from gpumon.model import ProcessOwner, ProcessSample, Snapshot
from gpumon.owners.cgroups import CgroupFacts, parse_cgroup
from gpumon.owners.reader import HostPaths, OwnerReader, on_mapped_card
from gpumon.owners.records import ContainerNames, JobMap, PodNames

CID = "3f2a9c0d1e2b4a5c6d7e8f90123456789abcdef0123456789abcdef012345678"  # 64 hex
CID2 = "ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12cd34ef56ab12"
UID = "1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
UID_ = UID.replace("-", "_")
STATIC = "6b4a62d1a9d4b5f8c4c3f8e21e2f6b2a"  # a static pod's UID: its manifest's hash


def slurm(job, step=None, unit=None):
    return CgroupFacts(slurm_job=job, slurm_step=step, unit=unit)


def pod(uid, cid=None, engine=None, unit=None):
    return CgroupFacts(pod_uid=uid, container_id=cid, engine=engine, unit=unit)


def container(cid, engine, unit=None):
    return CgroupFacts(container_id=cid, engine=engine, unit=unit)


CGROUP_LINES = [
    # Slurm, cgroup v1 (task/cgroup): every controller Slurm constrains has the job's path.
    ("12:freezer:/slurm/uid_1000/job_4242/step_0/task_0", slurm("4242", "0")),
    ("11:memory:/slurm/uid_1000/job_4242/step_batch/task_0", slurm("4242", "batch")),
    ("4:devices:/slurm/uid_1000/job_4242/step_extern/task_0", slurm("4242", "extern")),
    ("10:cpuset:/slurm_node01/uid_1000/job_77/step_interactive", slurm("77", "interactive")),
    ("4:memory:/slurm/uid_1000/job_4242", slurm("4242")),
    ("7:devices:/slurm/uid_1000/job_4242/step_12/task_3", slurm("4242", "12")),
    # Slurm, cgroup v2: under slurmstepd's scope (named after the node with several slurmds).
    ("0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0", slurm("4242", "0", "slurmstepd.scope")),
    ("0::/system.slice/node01_slurmstepd.scope/job_4242/step_batch/user/task_0",
     slurm("4242", "batch", "node01_slurmstepd.scope")),
    ("0::/system.slice/slurmstepd.scope/job_4242/step_extern/user/task_special",
     slurm("4242", "extern", "slurmstepd.scope")),
    ("0::/system.slice/slurmstepd.scope/job_9/step_interactive/user/task_0",
     slurm("9", "interactive", "slurmstepd.scope")),
    # ... a het job's component, and Slurm run inside a pod (Slinky): the job is what people ask about.
    ("0::/system.slice/slurmstepd.scope/job_50/step_0+1/user/task_0", slurm("50", "0+1", "slurmstepd.scope")),
    (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope/system.slice/slurmstepd.scope/"
     "job_61/step_0/user/task_0", CgroupFacts("61", "0", UID, CID, "containerd", "slurmstepd.scope")),
    # Kubernetes, cgroupfs driver: each QoS class (guaranteed has no level of its own).
    (f"11:memory:/kubepods/burstable/pod{UID}/{CID}", pod(UID, CID)),
    (f"11:memory:/kubepods/pod{UID}/{CID}", pod(UID, CID)),
    (f"11:memory:/kubepods/besteffort/pod{UID}/{CID}", pod(UID, CID)),
    (f"0::/kubepods/burstable/pod{STATIC}/{CID}", pod(STATIC, CID)),
    # Kubernetes, systemd driver: containerd, CRI-O and Docker scopes, each QoS class.
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{CID}.scope",
     pod(UID, CID, "containerd", f"cri-containerd-{CID}.scope")),
    (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{CID}.scope",
     pod(UID, CID, "cri-o", f"crio-{CID}.scope")),
    (f"0::/kubepods.slice/kubepods-pod{UID_}.slice/docker-{CID}.scope", pod(UID, CID, "docker", f"docker-{CID}.scope")),
    # ... nested under another slice (kind, k3s in a unit), and a process in the pod's own cgroup.
    (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
     pod(UID, CID, "containerd", f"cri-containerd-{CID}.scope")),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice", pod(UID)),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{CID}.scope",
     pod(UID, unit=f"crio-conmon-{CID}.scope")),
    # Docker and Podman: systemd and cgroupfs drivers, rootless Podman, Docker in Docker.
    (f"0::/system.slice/docker-{CID}.scope", container(CID, "docker", f"docker-{CID}.scope")),
    (f"12:pids:/docker/{CID}", container(CID, "docker")),
    (f"0::/machine.slice/libpod-{CID}.scope/container", container(CID, "podman", f"libpod-{CID}.scope")),
    (f"1:name=systemd:/libpod_parent/libpod-{CID}", container(CID, "podman")),
    (f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container",
     container(CID, "podman", f"libpod-{CID}.scope")),
    (f"0::/docker/{CID}/docker/{CID2}", container(CID, "docker")),
    # systemd units: the deepest one.
    ("0::/user.slice/user-1000.slice/session-3.scope", CgroupFacts(unit="session-3.scope")),
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-org.gnome.Terminal.slice/vte-spawn-1a2b.scope",
     CgroupFacts(unit="vte-spawn-1a2b.scope")),
    ("0::/system.slice/ollama.service", CgroupFacts(unit="ollama.service")),
    ("1:name=systemd:/system.slice/nvidia-persistenced.service", CgroupFacts(unit="nvidia-persistenced.service")),
    ("0::/system.slice/slurmd.service", CgroupFacts(unit="slurmd.service")),
    (f"0::/machine.slice/libpod-conmon-{CID}.scope", CgroupFacts(unit=f"libpod-conmon-{CID}.scope")),
    # None of them: the root, a sandbox's own groups, look-alikes that are not the shapes.
    ("0::/", CgroupFacts()),
    ("4:memory:/process_api/3fad6a853a4174fa437d27b0a584b083", CgroupFacts()),
    ("0::/jobs/job_42/step_0", CgroupFacts()),  # not under a slurm directory
    ("0::/kubepods-like/podnotauid/abc", CgroupFacts()),
    (f"0::/dockerd/{CID}", CgroupFacts()),
    ("5:cpu:/docker/notahexid", CgroupFacts()),
    ("", CgroupFacts()),
    ("garbage without colons", CgroupFacts()),
]


@pytest.mark.parametrize(("line", "expected"), CGROUP_LINES, ids=[f"{i}" for i in range(len(CGROUP_LINES))])
def test_cgroup_lines(line, expected):
    assert parse_cgroup(line + "\n") == expected


def test_a_whole_v1_file_with_a_v2_line_and_the_systemd_hierarchy():
    """A hybrid host: the job is on the controllers Slurm constrains, the unit on the systemd lines
    (the v2 line first: on a hybrid systemd host both say the same)."""
    text = ("13:misc:/\n12:pids:/user.slice/user-1000.slice/session-4.scope\n"
            "11:freezer:/slurm/uid_1000/job_4242/step_0/task_0\n10:cpu,cpuacct:/user.slice\n"
            "1:name=systemd:/user.slice/user-1000.slice/session-4.scope\n"
            "0::/user.slice/user-1000.slice/session-5.scope\n")
    assert parse_cgroup(text) == slurm("4242", "0", "session-5.scope")
    assert parse_cgroup(text.replace("11:freezer:/slurm/uid_1000/job_4242/step_0/task_0\n", "")).unit == \
        "session-5.scope"
    assert parse_cgroup("1:name=systemd:/system.slice/a.service\n0::/\n").unit == "a.service"


def test_a_pod_found_on_one_hierarchy_and_its_container_on_another():
    text = f"5:cpu:/kubepods/burstable/pod{UID}\n4:memory:/kubepods/burstable/pod{UID}/{CID}\n"
    assert parse_cgroup(text) == pod(UID, CID)


def test_a_unit_name_with_control_characters_is_made_printable():
    assert parse_cgroup("0::/user.slice/\x1b]0;pwned\x07.scope\n").unit == "\\x1b]0;pwned\\x07.scope"


# -- the host's records --


def write_proc(root, pid, cgroup, environ=None):
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup)
    if environ is not None:
        (root / str(pid) / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in environ.items()) + b"\0")


def test_slurm_owner_from_the_cgroup_and_the_jobs_environment(tmp_path):
    proc = tmp_path / "proc"
    write_proc(proc, 10, "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    write_proc(proc, 11, "12:freezer:/slurm/uid_0/job_5001/step_batch/task_0\n",
               {"SLURM_JOB_ID": "5001", "SLURM_ARRAY_JOB_ID": "5000", "SLURM_ARRAY_TASK_ID": "7",
                "SLURM_JOB_NAME": "sweep\x1b[2J", "PATH": "/bin"})
    # An environment from another job (inherited, or a job launched from inside another): not this one's.
    write_proc(proc, 12, "12:freezer:/slurm/uid_0/job_6001/step_0/task_0\n",
               {"SLURM_JOB_ID": "5001", "SLURM_ARRAY_JOB_ID": "5000", "SLURM_ARRAY_TASK_ID": "7"})
    reader = OwnerReader(HostPaths(procfs=proc))
    assert reader.read(10, "alice") == ProcessOwner("slurm", "4242.0", None, "alice")
    assert reader.read(11, "bob") == ProcessOwner("slurm", "5000_7.batch", "sweep\\x1b[2J", "bob")
    assert reader.read(12, "bob") == ProcessOwner("slurm", "6001.0", None, "bob")


def test_a_process_that_cannot_be_read_is_owned_by_its_user(tmp_path):
    reader = OwnerReader(HostPaths(procfs=tmp_path))
    assert reader.read(99, "alice") == ProcessOwner("user", "alice", None, "alice")
    assert reader.read(99, None) == ProcessOwner("user", "?", None, None)


def test_pod_names_from_the_kubelets_log_directories(tmp_path):
    pods = tmp_path / "log" / "pods"
    links = tmp_path / "log" / "containers"
    links.mkdir(parents=True)
    (pods / f"ml_trainer-7f9c_{UID}" / "main").mkdir(parents=True)
    (pods / f"ml_trainer-7f9c_{UID}" / "sidecar").mkdir()
    (links / f"trainer-7f9c_ml_main-{CID}.log").symlink_to(pods / f"ml_trainer-7f9c_{UID}" / "main" / "0.log")
    (links / f"trainer-7f9c_ml_sidecar-{CID2}.log").touch()
    other = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
    (pods / f"default_notebook-0_{other}" / "jupyter").mkdir(parents=True)
    names = PodNames(pods)
    assert names.name(UID, CID) == "ml/trainer-7f9c (main)"
    assert names.name(UID, CID2) == "ml/trainer-7f9c (sidecar)"
    assert names.name(UID, None) == "ml/trainer-7f9c"  # two containers, no id: which one is not known
    assert names.name(UID, "f" * 64) == "ml/trainer-7f9c"
    assert names.name(other, "e" * 64) == "default/notebook-0 (jupyter)"  # its only container
    assert names.name("ffffffff-0000-0000-0000-000000000000", CID) is None
    assert PodNames(tmp_path / "missing").name(UID, CID) is None


def test_container_names_from_docker_and_podman_state(tmp_path):
    docker, podman = tmp_path / "docker", tmp_path / "storage"
    (docker / "containers" / CID).mkdir(parents=True)
    (docker / "containers" / CID / "config.v2.json").write_text(json.dumps({"ID": CID, "Name": "/llama"}))
    (docker / "containers" / CID2).mkdir(parents=True)
    (docker / "containers" / CID2 / "config.v2.json").write_text("{not json")
    (podman / "overlay-containers").mkdir(parents=True)
    state = podman / "overlay-containers" / "containers.json"
    state.write_text(json.dumps([{"id": CID2, "names": ["whisper"], "image": "x"}, {"id": "bad"}, "junk"]))
    names = ContainerNames(docker, podman)
    assert names.name("docker", CID) == "llama"
    assert names.name("docker", CID2) is None
    assert names.name("podman", CID2) == "whisper"
    assert names.name("podman", CID) is None
    state.write_text(json.dumps([{"id": CID, "names": ["renamed"]}]) + " ")  # podman's state changed
    assert names.name("podman", CID) == "renamed"
    assert ContainerNames(tmp_path / "no", tmp_path / "no").name("docker", CID) is None


@pytest.mark.parametrize("driver", ["vfs", "btrfs", "zfs"])
def test_podman_names_for_every_storage_driver(tmp_path, driver):
    """containers/storage keeps names in `<driver>-containers/containers.json`; a root may hold
    overlay's beside another driver's."""
    podman = tmp_path / "storage"
    for name, cid, label in (("overlay", CID, "old"), (driver, CID2, f"on-{driver}")):
        (podman / f"{name}-containers").mkdir(parents=True)
        (podman / f"{name}-containers" / "containers.json").write_text(json.dumps([{"id": cid, "names": [label]}]))
    names = ContainerNames(tmp_path / "docker", podman)
    assert (names.name("podman", CID2), names.name("podman", CID)) == (f"on-{driver}", "old")


def test_owner_of_a_pod_and_a_container_by_their_records(tmp_path):
    proc, pods, docker = tmp_path / "proc", tmp_path / "pods", tmp_path / "docker"
    (pods / f"ml_trainer-7f9c_{UID}" / "main").mkdir(parents=True)
    (docker / "containers" / CID).mkdir(parents=True)
    (docker / "containers" / CID / "config.v2.json").write_text(json.dumps({"Name": "/llama"}))
    write_proc(proc, 20, f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n")
    write_proc(proc, 21, f"0::/system.slice/docker-{CID}.scope\n")
    write_proc(proc, 22, f"0::/system.slice/docker-{CID2}.scope\n")
    write_proc(proc, 23, "0::/system.slice/ollama.service\n")
    reader = OwnerReader(HostPaths(procfs=proc, pods_dir=pods, docker_dir=docker, podman_dir=tmp_path / "none"))
    assert reader.read(20, "root") == ProcessOwner("k8s", UID, "ml/trainer-7f9c (main)", "root")
    assert reader.read(21, "root") == ProcessOwner("container", CID[:12], "llama", "root", "docker")
    assert reader.read(22, "root") == ProcessOwner("container", CID2[:12], None, "root", "docker")
    assert reader.read(23, "ollama") == ProcessOwner("unit", "ollama.service", None, "ollama")
    assert [reader.read(p, "root").label for p in (20, 21, 22, 23)] == \
        ["ml/trainer-7f9c (main)", "docker:llama", f"docker:{CID2[:12]}", "ollama.service"]


def test_the_job_map_reads_a_card_by_index_or_uuid_and_sees_changes(tmp_path):
    jobs = JobMap(tmp_path)
    assert jobs.jobs(0, "GPU-a") is None
    (tmp_path / "0").write_text("4242\n")
    (tmp_path / "GPU-b").write_text("77\n78\n\n77\n")
    assert jobs.jobs(0, "GPU-a") == "4242"
    assert jobs.jobs(1, "GPU-b") == "77,78"
    (tmp_path / "0").write_text("4243\n")  # the next job's prolog, within the same second
    os.utime(tmp_path / "0", ns=(1, 1))
    assert jobs.jobs(0, "GPU-a") == "4243"
    (tmp_path / "0").write_text("")
    assert jobs.jobs(0, "GPU-a") is None
    (tmp_path / "0").unlink()  # the epilog
    assert jobs.jobs(0, None) is None


def test_a_mapped_card_gives_its_job_to_processes_without_their_own():
    alice = ProcessOwner("unit", "session-3.scope", None, "alice")
    assert on_mapped_card(alice, "4242") == ProcessOwner("slurm", "4242", None, "alice")
    assert on_mapped_card(None, "4242") == ProcessOwner("slurm", "4242", None, None)
    own = ProcessOwner("slurm", "77.0", None, "bob")
    assert on_mapped_card(own, "4242") is own


# -- in the documents --


def snapshot_with(owner):
    from gpumon.model import GpuSample

    process = ProcessSample(pid=5, type="compute", gpu_memory=1, user="alice", owner=owner)
    return Snapshot(time=1.0, host="h", backend="nvml", driver_version=None, cuda_driver_version=None,
                    gpus=(GpuSample(index=0, uuid="GPU-1", name="A", pci_bus_id=None, processes=(process,)),))


OWNERS = [
    ProcessOwner("slurm", "5000_7.batch", "sweep", "alice"),
    ProcessOwner("k8s", UID, "ml/trainer-7f9c (main)", "root"),
    ProcessOwner("container", CID[:12], "llama", "root", "docker"),
    ProcessOwner("unit", "ollama.service", None, "ollama"),
    ProcessOwner("user", "alice", None, "alice"),
    None,
]


@pytest.mark.parametrize("owner", OWNERS)
def test_owner_in_json_recordings_and_the_fleet_stream(owner):
    doc = json.loads(json.dumps(snapshot_with(owner).to_dict()))
    process = doc["gpus"][0]["processes"][0]
    assert process["owner"] == (None if owner is None else
                                {"kind": owner.kind, "id": owner.id, "name": owner.name, "user": owner.user,
                                 "engine": owner.engine})
    assert Snapshot.from_dict(doc).gpus[0].processes[0].owner == owner
    assert snapshot_from_remote(doc).gpus[0].processes[0].owner == owner


def test_a_stream_without_owners_still_reads():
    doc = snapshot_with(None).to_dict()
    del doc["gpus"][0]["processes"][0]["owner"]
    assert snapshot_from_remote(doc).gpus[0].processes[0].owner is None
    assert Snapshot.from_dict(doc).gpus[0].processes[0].owner is None


def test_the_fleet_checks_a_remote_owner():
    def remote(owner):
        doc = snapshot_with(None).to_dict()
        doc["gpus"][0]["processes"][0]["owner"] = owner
        return snapshot_from_remote(doc).gpus[0].processes[0].owner

    hostile = remote({"kind": "k8s", "id": "x" * 5000, "name": "\x1b]0;pwned\x07" + "n" * 5000,
                      "user": "\u202eroot", "engine": None})
    assert len(hostile.id) == 256 and hostile.name.startswith("\\x1b]0;pwned\\x07") and len(hostile.name) < 600
    assert hostile.user == "\\u202eroot"
    assert remote({"kind": "lsf", "id": "1"}) is None  # a newer gpumon's kind: left out
    assert remote({"kind": "user", "id": "bob"}) == ProcessOwner("user", "bob")
    for bad in ("alice", {"kind": "user"}, {"kind": "user", "id": 5}, {"kind": "unit", "id": "a", "name": ["x"]}):
        with pytest.raises(SchemaError, match=r"processes\[0\]\.owner"):
            remote(bad)


@pytest.mark.parametrize(("config", "message"), [
    ('[owners]\nprocs = "/proc"\n', "line 2: unknown key 'owners.procs'"),
    ("[owners]\npods_dir = 5\n", "'owners.pods_dir' must be str, not int"),
    ('[paths]\nprocfs = "/nonexistent"\n', "[paths] procfs) '/nonexistent' is not a directory"),
])
def test_bad_owner_paths_in_the_config_are_usage_errors(tmp_path, config, message):
    import subprocess
    import sys

    file = tmp_path / "config.toml"
    file.write_text(config)
    out = subprocess.run([sys.executable, "-m", "gpumon", "snapshot", "--demo", "--config", str(file)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
