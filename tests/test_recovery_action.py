"""The driver's recovery action (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, field 230), read with the
health counters: anything but NONE fails the card with exactly what the driver asks, in `snapshot
--json`, `gpumon health`, the TUI's `h`, the exporter and what the fleet accepts; a driver without
the field gives null and is never asked again."""

from __future__ import annotations

import io
import json
import urllib.request

import pytest
from conftest import Card
from promlab import Exporter, wait_until
from rich.console import Console

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.fleet.schema import SchemaError, snapshot_from_remote
from gpumon.health import rules as health_rules
from gpumon.tui.screens.health import counters_table

H100 = "NVIDIA H100 80GB HBM3"


def three_cards(fake_driver) -> None:
    fake_driver.machine.cards = [Card(H100, extra=dict(recovery_action=2)), Card(H100, extra=dict(recovery_action=0)),
                                 Card(H100, extra=dict(recovery_action=4)), Card("Tesla V100-SXM2-32GB")]
    fake_driver.write()


def test_a_recovery_action_fails_the_card_with_what_the_driver_asks(fake_driver):
    three_cards(fake_driver)
    result = fake_driver.run("snapshot", "--json")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    reboot, fine, drain, old = doc["gpus"]
    assert [g["recovery_action"] for g in doc["gpus"]] == ["node_reboot", "none", "drain_and_reset", None]
    assert reboot["health"]["verdict"] == "fail"
    (reason,) = reboot["health"]["reasons"]
    assert reason["code"] == "recovery_action" and "node_reboot" in reason["text"]
    assert "reboot" in reason["action"] and "a GPU reset is not enough" in reason["action"]
    assert "drain peer-to-peer work and reset the card" in drain["health"]["reasons"][0]["action"]
    assert fine["health"]["verdict"] == old["health"]["verdict"] == "ok"

    # The fleet takes it from another host as it is, and refuses what is not an action.
    gpus = snapshot_from_remote(doc).gpus
    assert [g.counters.recovery_action if g.counters else None for g in gpus] == [
        "node_reboot", "none", "drain_and_reset", None]
    doc["gpus"][0]["recovery_action"] = "[red]reboot"
    with pytest.raises(SchemaError, match="recovery_action"):
        snapshot_from_remote(doc)

    # The TUI's `h` lists it with the counters.
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(counters_table(gpus[0]))
    shown = [line.split() for line in console.export_text().splitlines()]
    assert ["Recovery", "action", "node_reboot"] in [words[:3] for words in shown]


def test_gpumon_health_says_it_and_fails(fake_driver):
    three_cards(fake_driver)
    result = fake_driver.run("health")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["GPU", "0", "FAIL"] and "recovery_action: the driver's recovery action is " \
        "node_reboot -> the driver asks for a node reboot" in lines[0]
    assert lines[1].split()[:3] == ["GPU", "1", "ok"] and lines[3].split()[:3] == ["GPU", "3", "ok"]


def test_the_exporter_has_one_gauge_of_it(fake_driver):
    three_cards(fake_driver)
    exporter = Exporter(fake_driver.env, "node-1").start()
    try:
        def scraped() -> str | None:
            with urllib.request.urlopen(f"http://{exporter.target}/metrics", timeout=5) as answer:
                text = answer.read().decode()
            return text if "gpumon_gpu_recovery_action{" in text else None

        text = wait_until(scraped, 30, "the recovery action gauge")
    finally:
        exporter.stop()
    values = {line.split('gpu="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
              for line in text.splitlines() if line.startswith("gpumon_gpu_recovery_action{")}
    assert values == {"0": 2.0, "1": 0.0, "2": 4.0}  # the V100's driver field is missing: no sample, not 0
    assert "# TYPE gpumon_gpu_recovery_action gauge" in text


def test_a_driver_without_the_field_is_never_asked_again(fake_driver):
    fake_driver.machine.cards = [Card("Tesla V100-SXM2-32GB", extra=dict(mem_temp=50))]
    fake_driver.write()
    every_sample = health_rules.parse_settings({"interval": "0s"})  # read the counters every sample
    backend = NvmlBackend(lib_path=str(fake_driver.lib), health=every_sample)
    try:
        for _ in range(3):
            gpu = backend.sample().gpus[0]
        assert gpu.counters.recovery_action is None and gpu.counters.memory_temperature == 50
        asked, _ = backend.cards[0].fields
        assert "recovery_action" not in asked and "memory_temperature" in asked
    finally:
        backend.close()
