"""The real `gpumon` command: output against the fake driver, exit codes, one-line errors."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys

import pytest
from conftest import GIB, Card


def gpumon(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumon", *args], capture_output=True, text=True,
                          timeout=60, env=env)


def assert_one_line_error(result: subprocess.CompletedProcess[str], status: int, *words: str) -> None:
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0]


def test_snapshot_json_is_exactly_what_the_driver_says(fake_driver, idle_processes):
    worker = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", "--epochs", "3")
    m = fake_driver.machine
    m.cards = [
        Card("NVIDIA RTX A6000", uuid="GPU-aaaaaaaa-0000-1111-2222-333333333333", bus="00000000:01:00.0",
             mem_total=48 * GIB, extra=dict(util=71, temp=66, unsupported="fan,pcie")),
        Card("NVIDIA RTX A6000", uuid="GPU-bbbbbbbb-0000-1111-2222-333333333333", bus="00000000:21:00.0",
             mem_total=48 * GIB, extra=dict(util=0)),
        Card("NVIDIA A40", uuid="GPU-cccccccc-0000-1111-2222-333333333333", bus="00000000:41:00.0",
             mem_total=48 * GIB, extra=dict(lost_after=0.3)),
    ]
    # The A40 falls off the bus after gpumon has read its identity, while the sample is taken
    # (cards are read at once, each on its own lane: the slow call spans the moment it is lost).
    m.delays = {"nvmlDeviceGetUtilizationRates": 400}
    m.procs = [dict(gpu=0, pid=worker.pid, mem=5 * GIB, sm=64)]
    fake_driver.write()
    result = fake_driver.run("snapshot", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["schema"] == 1 and doc["backend"] == "nvml"
    assert [g["name"] for g in doc["gpus"]] == ["NVIDIA RTX A6000", "NVIDIA RTX A6000", "NVIDIA A40"]
    assert [g["uuid"][:12] for g in doc["gpus"]] == ["GPU-aaaaaaaa", "GPU-bbbbbbbb", "GPU-cccccccc"]
    assert [g["pci_bus_id"] for g in doc["gpus"]] == ["00000000:01:00.0", "00000000:21:00.0", "00000000:41:00.0"]
    assert [g["state"] for g in doc["gpus"]] == ["ok", "ok", "lost"]
    first = doc["gpus"][0]
    assert first["utilization_gpu"] == 71 and first["temperature"] == 66
    assert first["fan"] is None and first["pcie_tx"] is None and first["pcie_rx"] is None
    assert first["memory_total"] == 48 * GIB and first["memory_used"] == 5 * GIB
    (proc,) = first["processes"]
    assert proc["pid"] == worker.pid and proc["gpu_memory"] == 5 * GIB and proc["sm_util"] == 64
    assert proc["user"] == getpass.getuser()
    assert proc["command"].endswith("--epochs 3")
    assert doc["gpus"][1]["processes"] == []
    assert doc["gpus"][2]["utilization_gpu"] is None


def test_snapshot_table_shows_cards_and_processes(fake_driver, idle_processes):
    worker = idle_processes()
    fake_driver.machine.cards = [Card("NVIDIA H200", extra=dict(util=12)),
                                 Card("NVIDIA H200", extra=dict(lost_after=0))]
    fake_driver.machine.procs = [dict(gpu=0, pid=worker.pid, mem=GIB)]
    fake_driver.write()
    result = fake_driver.run("snapshot")
    assert result.returncode == 0, result.stderr
    assert "NVIDIA H200" in result.stdout and "LOST" in result.stdout
    assert str(worker.pid) in result.stdout and "12%" in result.stdout


def test_zero_cards(fake_driver):
    fake_driver.write()
    result = fake_driver.run("snapshot", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["gpus"] == []
    assert "No NVIDIA GPUs" in fake_driver.run("snapshot").stdout


def test_no_driver_exits_3_and_suggests_demo(tmp_path):
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    env.pop("GPUMON_NVML_LIB", None)
    result = gpumon("snapshot", env=env)
    assert_one_line_error(result, 3, "no NVIDIA driver", "--demo")


def test_driver_upgraded_exits_3(fake_driver):
    fake_driver.machine.init_error = 18
    fake_driver.write()
    assert_one_line_error(fake_driver.run("snapshot"), 3, "driver was upgraded", "reboot or reload")


def test_nvml_lib_option_that_does_not_exist(tmp_path):
    assert_one_line_error(gpumon("snapshot", "--nvml-lib", str(tmp_path / "nope.so")), 3, "nope.so")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["snapshot", "--interval", "abc"], ["--interval", "abc"]),
        (["--interval", "0.01", "snapshot"], ["--interval", "0.1"]),
        (["snapshot", "--demo", "nosuch"], ["nosuch"]),
        (["snapshot", "--scenario", "nosuch"], ["nosuch", "default"]),
        (["frobnicate"], ["frobnicate"]),
        (["snapshot", "--bogus"], ["--bogus"]),
        (["snapshot", "--demo", "--replay", "x.jsonl"], ["--demo", "--replay"]),
        (["snapshot", "--replay", "/nonexistent/rec.jsonl"], ["/nonexistent/rec.jsonl"]),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words):
    assert_one_line_error(gpumon(*args), 2, *words)


def test_demo_snapshot_says_it_is_a_demo():
    table = gpumon("snapshot", "--demo")
    assert table.returncode == 0 and "DEMO" in table.stdout
    doc = json.loads(gpumon("--demo", "snapshot", "--json").stdout)
    assert doc["backend"] == "demo" and len(doc["gpus"]) == 4


def test_demo_scenario_after_the_subcommand():
    doc = json.loads(gpumon("snapshot", "--json", "--demo", "workstation").stdout)
    assert [g["name"] for g in doc["gpus"]] == ["NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 4090"]


def test_version_and_help_exit_0():
    assert gpumon("--version").returncode == 0
    assert "snapshot" in gpumon("--help").stdout
