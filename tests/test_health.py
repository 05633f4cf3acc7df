"""Card health: the counters the fake driver serves, through the real bindings and the
real `gpumon` command, the verdict drawn from them, and `gpumon health`'s exit statuses."""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
import time

import pytest
from conftest import GIB, Card
from test_cli import assert_one_line_error

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.counters import COUNTER_KEYS
from gpumon.health import rules as health_rules

H100 = "NVIDIA H100 80GB HBM3"
REMAPS_OK = dict(remap_cor=0, remap_unc=0, remap_pending=0, remap_failure=0)
A100 = "NVIDIA A100-SXM4-80GB"
# Every counter the fake serves, at fixed values.
EVERY_COUNTER = dict(
    remap_cor=3, remap_unc=1, remap_pending=0, remap_failure=0, ecc_corrected=5, ecc_corrected_agg=50,
    ecc_uncorrected_agg=2, pcie_replay=7, mem_temp=71, mem_temp_max=95, energy_mj=3_600_000, power_mw=250_000,
    switch_links=4, nvlink_tx_kibs=1000, nvlink_rx_kibs=2000, nvlink_crc_flit=1, nvlink_crc_data=2, nvlink_replay=3,
    nvlink_recovery=4, clk_sw_power=10, clk_hw_thermal=5, gpm=1, gpm_gr=90, gpm_sm=55, gpm_occupancy=33,
    gpm_tensor=40, gpm_dram=20,
)


def cards(doc: dict) -> list[dict]:
    return doc["gpus"]


def snapshot(fake_driver, *args: str) -> dict:
    result = fake_driver.run("snapshot", "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_snapshot_has_every_counter_under_its_own_key_null_where_unsupported(fake_driver):
    m = fake_driver.machine
    m.cards = [Card(H100, extra=EVERY_COUNTER),
               Card(A100, extra=dict(retired_sbe=4, retired_dbe=1, retired_pending=0)),
               Card("NVIDIA GeForce RTX 3090", mem_total=24 * GIB)]
    fake_driver.write()
    hopper, older, geforce = cards(snapshot(fake_driver))
    assert (hopper["remapped_rows_correctable"], hopper["remapped_rows_uncorrectable"]) == (3, 1)
    assert (hopper["remapped_rows_pending"], hopper["remapped_rows_failure"]) == (False, False)
    assert (hopper["ecc_errors_corrected"], hopper["ecc_errors_corrected_aggregate"],
            hopper["ecc_errors_uncorrected_aggregate"]) == (5, 50, 2)
    assert hopper["pcie_replay_counter"] == 7
    assert (hopper["memory_temperature"], hopper["memory_temperature_max"]) == (71, 95)
    assert hopper["energy_source"] == "driver" and hopper["energy_j"] == pytest.approx(3600, abs=10)  # mJ -> J
    assert (hopper["nvlink_crc_flit_errors"], hopper["nvlink_crc_data_errors"], hopper["nvlink_replay_errors"],
            hopper["nvlink_recovery_errors"]) == (1, 2, 3, 4)
    assert hopper["nvlink_tx_total"] is not None and hopper["nvlink_tx_total"] % 1024 == 0  # KiB -> bytes
    assert set(hopper["clock_event_s"]) == {"sw_power_cap", "sync_boost", "sw_thermal", "hw_thermal", "hw_power_brake"}
    assert hopper["clock_event_s"]["sync_boost"] is None and hopper["clock_event_s"]["sw_power_cap"] is not None
    assert hopper["health"] == {"verdict": "ok", "reasons": []}
    # Page retirement on the older card; no row remapping there.
    assert (older["retired_pages_sbe"], older["retired_pages_dbe"], older["retired_pages_pending"]) == (4, 1, False)
    assert older["remapped_rows_correctable"] is None
    # A card without any of them: every key there, every one null (never 0).
    assert all(geforce[key] is None for key in COUNTER_KEYS), {k: geforce[k] for k in COUNTER_KEYS if geforce[k]}
    assert geforce["health"]["verdict"] == "ok"


def read_every(tmp_path, interval: str = "2s") -> str:
    """A config that reads the health counters this often (30 s by default)."""
    config = tmp_path / "every.toml"
    config.write_text(f'[health]\ninterval = "{interval}"\n')
    return str(config)


def test_rates_gpm_and_throttled_time_over_two_reads(fake_driver, tmp_path):
    """Between two counter reads: the PCIe replay rate, NVLink throughput, the share of time
    throttled, and GPM's metrics on the Hopper card (none on the Ampere one)."""
    m = fake_driver.machine
    m.cards = [Card(H100, extra={**EVERY_COUNTER, "pcie_replay": "0+2/s"}),
               Card(A100, extra=dict(mem_temp=60, power_mw=100_000))]
    fake_driver.write()
    proc = subprocess.Popen([sys.executable, "-m", "gpumon", "snapshot", "--json", "--stream", "--interval", "0.5",
                             "--config", read_every(tmp_path, "5s")],
                            env=fake_driver.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            doc = json.loads(proc.stdout.readline())
            hopper, ampere = cards(doc)
            if hopper["pcie_replay_rate"] is not None and ampere["energy_source"] == "integrated":
                break
        else:
            pytest.fail(f"no second counter read: {hopper}")
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)
    assert hopper["pcie_replay_rate"] == pytest.approx(2.0, rel=0.2)  # per second
    links = 4
    assert hopper["nvlink_tx"] == pytest.approx(1000 * 1024 * links, rel=0.2)
    assert hopper["nvlink_rx"] == pytest.approx(2000 * 1024 * links, rel=0.2)
    assert hopper["throttled_power_pct"] == pytest.approx(10, abs=3)
    assert hopper["throttled_thermal_pct"] == pytest.approx(5, abs=3)
    assert hopper["throttled_hw_slowdown_pct"] == pytest.approx(5, abs=3)
    assert (hopper["gr_engine_active"], hopper["sm_active"], hopper["sm_occupancy"], hopper["tensor_active"],
            hopper["dram_active"]) == (90, 55, 33, 40, 20)
    assert ampere["sm_active"] is None and ampere["tensor_active"] is None  # no GPM before Hopper: null, not 0
    # No energy counter on the Ampere card here: its power (100 W) integrated over the samples.
    assert ampere["energy_j"] == pytest.approx(100 * 5, rel=0.5)


def calls(lib, fn: str) -> int:
    counter = ctypes.CDLL(str(lib)).fakeNvmlCallCount
    counter.restype = ctypes.c_ulong
    return counter(fn.encode())


def test_what_a_card_lacks_is_never_asked_again(fake_driver):
    fake_driver.machine.cards = [Card(A100, extra=dict(mem_temp=50))]  # no remaps, no GPM, no energy
    fake_driver.write()
    every_sample = health_rules.parse_settings({"interval": "0s"})  # read the counters every sample
    lib = fake_driver.lib
    asked_once = ("nvmlDeviceGetRemappedRows", "nvmlGpmQueryDeviceSupport", "nvmlDeviceGetTotalEnergyConsumption",
                  "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetTemperatureThreshold")
    # The library is loaded once per test run and counts for the whole run: count from here.
    before = {fn: calls(lib, fn) for fn in (*asked_once, "nvmlDeviceGetFieldValues")}
    backend = NvmlBackend(lib_path=str(lib), health=every_sample)
    try:
        for _ in range(5):
            gpu = backend.sample().gpus[0]
        assert gpu.counters.memory_temperature == 50 and gpu.counters.remapped_rows_correctable is None
    finally:
        backend.close()
    for fn in asked_once:
        assert calls(lib, fn) - before[fn] == 1, fn
    # one call a read, for the fields it has
    assert calls(lib, "nvmlDeviceGetFieldValues") - before["nvmlDeviceGetFieldValues"] == 5


def test_counters_on_an_old_driver_that_lacks_the_functions(fake_driver, build_fake):
    """Functions removed at link time, as on a driver that predates them: null, never a crash;
    retired pages fall back from _v2 to the original call."""
    old = build_fake(omit=("nvmlDeviceGetRemappedRows", "nvmlDeviceGetFieldValues", "nvmlDeviceGetPcieReplayCounter",
                           "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperatureThreshold",
                           "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleGet", "nvmlGpmMetricsGet",
                           "nvmlDeviceGetRetiredPages_v2"))
    fake_driver.machine.cards = [Card("Tesla V100-SXM2-32GB", extra={**EVERY_COUNTER, "retired_sbe": 2,
                                                                      "retired_dbe": 1, "retired_pending": 1})]
    fake_driver.write()
    result = subprocess.run([sys.executable, "-m", "gpumon", "--nvml-lib", str(old), "snapshot", "--json"],
                            env=fake_driver.env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    card = json.loads(result.stdout)["gpus"][0]
    lacking = ("remapped_rows_correctable", "memory_temperature", "pcie_replay_counter", "ecc_errors_corrected",
               "nvlink_replay_errors", "clock_event_s", "sm_active")
    assert all(card[k] is None for k in lacking), {k: card[k] for k in lacking}
    assert (card["retired_pages_sbe"], card["retired_pages_dbe"], card["retired_pages_pending"]) == (2, 1, True)
    assert card["health"]["verdict"] == "fail"  # pending page retirement
    assert [r["code"] for r in card["health"]["reasons"]] == ["retired_pending"]


# -- gpumon health --

def health(fake_driver, *args: str) -> subprocess.CompletedProcess[str]:
    return fake_driver.run("health", *args)


def test_health_exit_status_is_the_worst_verdict(fake_driver):
    m = fake_driver.machine
    m.cards = [Card(A100, extra=dict(remap_cor=0, remap_unc=0, remap_pending=0, remap_failure=0, mem_temp=70,
                                     mem_temp_max=95)), Card(A100)]
    fake_driver.write()
    ok = health(fake_driver)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[0].split()[:3] == ["GPU", "0", "ok"] and len(ok.stdout.splitlines()) == 2

    m.cards[1].extra.update(mem_temp=92, mem_temp_max=95)  # memory near its maximum: warn
    fake_driver.write()
    warn = health(fake_driver)
    assert warn.returncode == 1, warn.stdout + warn.stderr
    assert "WARN" in warn.stdout.splitlines()[1] and "mem_temp" in warn.stdout and "cooling" in warn.stdout

    m.cards[0].extra["remap_pending"] = 1  # a row remap waits for a reset: fail
    fake_driver.write()
    fail = health(fake_driver, "--json")
    assert fail.returncode == 2, fail.stderr
    doc = json.loads(fail.stdout)
    assert doc["verdict"] == "fail" and [g["health"]["verdict"] for g in doc["gpus"]] == ["fail", "warn"]
    (reason,) = doc["gpus"][0]["health"]["reasons"]
    assert reason["code"] == "remap_pending" and "reset the card to apply pending row remaps" in reason["action"]
    assert doc["gpus"][0]["remapped_rows_pending"] is True

    # A usage error shares status 2: told apart by nothing on stdout and one line on stderr.
    usage = health(fake_driver, "--no-such-option")
    assert usage.stdout == ""
    assert_one_line_error(usage, 2, "--no-such-option")


def test_lost_card_and_fabric_not_ready_fail(fake_driver):
    m = fake_driver.machine
    m.cards = [Card(H100, extra=dict(lost_after=0)), Card(H100, extra=dict(switch_links=18, fabric="not_started")),
               Card(H100, extra=dict(switch_links=18, fabric="completed"))]
    fake_driver.write()
    result = health(fake_driver, "--json")
    assert result.returncode == 2, result.stderr
    lost, unregistered, ready = json.loads(result.stdout)["gpus"]
    assert lost["state"] == "lost" and lost["health"]["reasons"][0]["code"] == "lost"
    assert [r["code"] for r in unregistered["health"]["reasons"]] == ["fabric"]
    assert "nvidia-fabricmanager" in unregistered["health"]["reasons"][0]["action"]
    assert ready["health"]["verdict"] == "ok"


def test_climbing_counters_are_measured_against_the_previous_run(fake_driver):
    """A check run every so often (Slurm, node-problem-detector) sees PCIe replays climbing
    between runs, and new correctable row remaps within the window."""
    fake_driver.machine.cards = [Card(A100, extra=dict(pcie_replay="0+1/s", remap_cor="2+0.5/s", remap_unc=0,
                                                       remap_pending=0, remap_failure=0))]
    fake_driver.write()
    first = health(fake_driver)
    assert first.returncode == 0, first.stdout  # nothing to compare with yet
    time.sleep(3)
    second = health(fake_driver, "--json")
    assert second.returncode == 1, second.stdout
    reasons = {r["code"]: r for r in json.loads(second.stdout)["gpus"][0]["health"]["reasons"]}
    assert set(reasons) == {"pcie_replays", "correctable_remaps"}
    assert "a minute" in reasons["pcie_replays"]["text"]


def test_config_overrides_a_rule(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(A100, extra=dict(mem_temp=92, mem_temp_max=95))]
    fake_driver.write()
    config = tmp_path / "config.toml"
    config.write_text('[health]\nwindow = "30m"\n[health.rules.mem_temp]\nverdict = "fail"\n')
    assert health(fake_driver, "--config", str(config)).returncode == 2
    config.write_text('[health.rules.mem_temp]\nverdict = "off"\n')
    assert health(fake_driver, "--config", str(config)).returncode == 0
    config.write_text('[health.rules.mem_temp]\nthreshold = 2\n')  # within 2 °C of the maximum only
    assert health(fake_driver, "--config", str(config)).returncode == 0
    for bad, words in (('[health.rules.nope]\nverdict = "off"\n', ("nope", "no such rule")),
                       ('[health.rules.mem_temp]\nverdict = "maybe"\n', ("verdict",)),
                       ('[health]\nwindow = "soon"\n', ("soon",)),
                       ('[health]\ninterval = 30\n', ("health.interval",))):
        config.write_text(bad)
        result = health(fake_driver, "--config", str(config))
        assert result.stdout == ""
        assert_one_line_error(result, 2, *words)


def test_select_and_run_auto_never_choose_a_failing_card(fake_driver):
    m = fake_driver.machine
    # Card 0 is the least loaded, but a remap is pending on it.
    m.cards = [Card(A100, extra=dict(remap_cor=0, remap_unc=0, remap_pending=1, remap_failure=0)),
               Card(A100, extra=dict(mem_used=2 * GIB, util=3))]
    fake_driver.write()
    chose = fake_driver.run("select", "--verbose")
    assert chose.returncode == 0, chose.stderr
    assert chose.stdout.strip() == "GPU-00000001-aaaa-bbbb-cccc-000000000001"
    assert "GPU 0 skipped: failing its health check: a row remap is pending" in chose.stderr
    ran = fake_driver.run("run", "--gpu", "auto", "--foreground", "--", sys.executable, "-c",
                          "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])")
    assert ran.returncode == 0, ran.stderr
    assert "GPU-00000001-aaaa-bbbb-cccc-000000000001" in ran.stdout
    two = fake_driver.run("select", "--count", "2")
    assert two.returncode == 1 and two.stdout == ""


def test_a_card_that_does_not_answer_warns(fake_driver):
    """A card whose calls hang has no fresh verdict: `health` says it is not responding (warn)
    within --timeout, and judges the others."""
    fake_driver.machine.cards = [Card(A100, extra=REMAPS_OK), Card(A100, extra=dict(slow=20000))]
    fake_driver.write()
    started = time.monotonic()
    result = health(fake_driver, "--timeout", "3")
    assert time.monotonic() - started < 20
    assert result.returncode == 1, result.stdout + result.stderr
    ok, silent = result.stdout.splitlines()
    assert ok.split()[:3] == ["GPU", "0", "ok"]
    assert silent.split()[:3] == ["GPU", "1", "WARN"] and "not_responding" in silent
