"""What `scontrol -d -o show job` and gres.conf say, as owners/slurm_gres.py reads it: the per-node
GRES of each job in the forms Slurm's versions write (`GRES=gpu:2(IDX:0-1)`, with a type
`gpu:a100:2(IDX:0,2-3)`, several types, older Slurm's `GRES_IDX=gpu(IDX:…)`), several nodes and
host lists, and only the states that hold cards. The real Slurm's own text is read in
tests/test_slurm_gres.py; here the forms that Slurm here (22.05) does not write."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

import psutil
from conftest import Card

from gpumon.model import GpuSample, ProcessOwner
from gpumon.owners.slurm_gres import SlurmGres, expand_list, expand_numbers, gres_minors, parse_jobs

ONE_LINERS = "\n".join([
    # two nodes in one detail (a host list), then this node with a type and an IDX list
    "JobId=10 JobName=train big model UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A Priority=1 "
    "JobState=RUNNING Reason=None NodeList=gpu[01-03] BatchHost=gpu01 NumNodes=3 TRES=cpu=6,gres/gpu=5 "
    "Nodes=gpu[01-02] CPU_IDs=0-1 Mem=0 GRES=gpu:2(IDX:0-1) "
    "Nodes=gpu03 CPU_IDs=0 Mem=0 GRES=gpu:a100:3(IDX:0,2-3) MinCPUsNode=1 Command=/x/run.sh",
    # older Slurm: GRES_IDX=
    "JobId=11 JobName=b UserId=bob(1002) JobState=SUSPENDED Nodes=gpu03 CPU_IDs=0 Mem=0 GRES_IDX=gpu(IDX:1)",
    # two types, and another GRES beside them
    "JobId=13 ArrayJobId=12 ArrayTaskId=4 JobName=sweep UserId=(null)(1004) JobState=COMPLETING "
    "Nodes=gpu03 CPU_IDs=0 Mem=0 GRES=gpu:a100:1(IDX:4),gpu:v100:2(IDX:6-7),mps:100(IDX:5)",
    # not holding: pending, ended; and a job elsewhere
    "JobId=14 JobName=p UserId=carol(1003) JobState=PENDING Reason=Resources NodeList=(null)",
    "JobId=15 JobName=e UserId=carol(1003) JobState=COMPLETED Nodes=gpu03 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:5)",
    "JobId=16 JobName=o UserId=carol(1003) JobState=RUNNING Nodes=gpu04 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:5)",
    # a job name that reads like a node's detail is no allocation
    "JobId=17 JobName=x Nodes=gpu03 GRES=gpu:1(IDX:5) UserId=eve(1005) JobState=RUNNING NodeList=gpu04",
    # no GPUs
    "JobId=18 JobName=cpu UserId=dan(1006) JobState=RUNNING Nodes=gpu03 CPU_IDs=1 Mem=0 GRES_IDX=",
])


def test_the_jobs_holding_this_nodes_gpus_in_every_form():
    jobs = {j.owner.id: (j.owner.name, j.owner.user, j.indices) for j in parse_jobs(ONE_LINERS, "gpu03")}
    assert jobs == {"10": ("train big model", "alice", (0, 2, 3)),
                    "11": ("b", "bob", (1,)),
                    "12_4": ("sweep", "1004", (4, 6, 7))}
    assert {j.owner.id: j.indices for j in parse_jobs(ONE_LINERS, "gpu02")} == {"10": (0, 1)}
    assert parse_jobs(ONE_LINERS, "gpu09") == []


def test_lists_and_ranges():
    assert expand_numbers("0,2-3") == [0, 2, 3]
    assert expand_numbers("N/A") == expand_numbers("3-1") == expand_numbers("1-") == []
    assert expand_list("gpu[01-03,7],login") == ["gpu01", "gpu02", "gpu03", "gpu7", "login"]
    assert expand_list("/dev/nvidia[0-1,3]") == ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia3"]
    assert expand_list("n[0-100000]") == []  # not read past a sane length


def test_gres_conf_says_which_device_each_position_is(tmp_path):
    # a device's own minor number wins over its name
    os.mknod(tmp_path / "nvidia9", 0o600 | stat.S_IFCHR, os.makedev(195, 2))
    conf = (f"AutoDetect=off\nNodeName=gpu[01-03] Name=gpu Type=a100 File=/dev/nvidia[4-5] # the A100s\n"
            f"NodeName=gpu07 Name=gpu File=/dev/nvidia0\n"
            f"Name=gpu File={tmp_path}/nvidia9\nName=mps Count=100\n")
    assert gres_minors(conf, "gpu03") == [4, 5, 2]
    assert gres_minors(conf, "gpu07") == [0, 2]
    assert gres_minors("AutoDetect=nvml\n", "gpu03") is None


def _cards(*minors: int) -> list[GpuSample]:
    return [GpuSample(index=i, uuid=f"GPU-{i}", name="A100", pci_bus_id=None, minor_number=m)
            for i, m in enumerate(minors)]


def test_positions_become_cards_by_minor_number_or_by_their_order(tmp_path):
    scontrol = tmp_path / "scontrol"
    scontrol.write_text("#!/bin/sh\necho 'JobId=7 JobName=j UserId=ann(1) JobState=RUNNING "
                        "Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:1)'\n")
    scontrol.chmod(0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    (tmp_path / "gres.conf").write_text("Name=gpu File=/dev/nvidia7\nName=gpu File=/dev/nvidia3\n")
    slurm = SlurmGres(str(scontrol), tmp_path / "slurm.conf", "n1")
    job = ProcessOwner("slurm", "7", "j", "ann")
    # gres.conf: position 1 is /dev/nvidia3
    assert slurm.allocations(_cards(7, 3, 5), wait_s=10) == {1: job}
    # AutoDetect (no File=): Slurm's list is the cards by minor number: position 1 is minor 5
    (tmp_path / "gres.conf").write_text("AutoDetect=nvml\n")
    slurm = SlurmGres(str(scontrol), tmp_path / "slurm.conf", "n1")
    assert slurm.allocations(_cards(7, 3, 5), wait_s=10) == {2: job}


def test_not_a_slurm_node_or_a_hung_scontrol_says_nothing(tmp_path):
    assert not SlurmGres("/usr/bin/true", None, "n1").usable
    assert SlurmGres("/usr/bin/true", None, "n1").allocations(_cards(0), wait_s=1) == {}
    hung = tmp_path / "scontrol"
    hung.write_text("#!/bin/sh\nexec sleep 30\n")
    hung.chmod(0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    slurm = SlurmGres(str(hung), tmp_path / "slurm.conf", "n1")
    started = time.monotonic()
    assert slurm.allocations(_cards(0)) == {}  # at once: asked in the background
    assert time.monotonic() - started < 1
    for proc in psutil.Process().children(recursive=True):  # the hung scontrol this test started
        if proc.name() == "sleep":
            proc.kill()


def test_a_host_without_slurm_forks_no_scontrol(fake_driver, tmp_path):
    """On a laptop (no slurm.conf) gpumon never runs scontrol, however long it samples."""
    asked = tmp_path / "asked"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho asked >> {asked}\n")
    (bin_dir / "scontrol").chmod(0o755)
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    env = {**fake_driver.env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": str(tmp_path / "none")}
    done = subprocess.run([sys.executable, "-m", "gpumon", "snapshot", "--json"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not asked.exists()


def test_a_controller_that_does_not_answer_is_not_asked_every_sample(tmp_path):
    """slurmctld down: scontrol fails at once; the samples that follow within FRESH_S ask nothing."""
    failing, asked = tmp_path / "scontrol", tmp_path / "asked"
    failing.write_text(f"#!/bin/sh\necho asked >> {asked}\necho 'slurm_load_jobs error: Unable to contact' >&2\n"
                       "exit 1\n")
    failing.chmod(0o755)
    (tmp_path / "slurm.conf").write_text("ClusterName=x\n")
    slurm = SlurmGres(str(failing), tmp_path / "slurm.conf", "n1")
    assert slurm.allocations(_cards(0), wait_s=10) == {}
    for _ in range(20):  # twenty samples
        assert slurm.allocations(_cards(0)) == {}
        time.sleep(0.01)
    assert asked.read_text().splitlines() == ["asked"]
