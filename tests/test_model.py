"""The snapshot model and its schema-1 JSON."""

from __future__ import annotations

import json

import pytest

from gpumon.cards.backends.demo import DemoBackend
from gpumon.errors import UsageError
from gpumon.model import GpuSample, ProcessOwner, ProcessSample, Snapshot, throttle_names
from gpumon.units import format_bytes, format_cpu_list, parse_cpu_list, parse_duration, parse_size

SCHEMA_GPU_KEYS = {
    "index", "uuid", "name", "pci_bus_id", "state", "utilization_gpu", "utilization_memory",
    "memory_total", "memory_used", "memory_free", "temperature", "fan", "power_draw", "power_limit",
    "clock_sm", "clock_mem", "pstate", "throttle_reasons", "ecc_errors_uncorrected", "pcie_tx",
    "pcie_rx", "encoder_util", "decoder_util", "numa_node", "cpu_affinity", "owner", "processes",
    # Added later: MIG mode, the NVSwitch fabric's state, and how long a hung card has been silent.
    "mig_mode", "compute_mode", "fabric", "stale_s",
    # Added later: whose card, and what the kernel says of AMD and Intel cards (null from NVML).
    "vendor", "temperature_junction", "temperature_memory", "gtt_total", "gtt_used", "pcie_link_speed",
    "pcie_link_width", "pcie_link_speed_max", "pcie_link_width_max", "vbios", "serial", "perf_level", "asleep",
    # Card health: the verdict and the raw counters, each under its own key.
    "health", "remapped_rows_correctable", "remapped_rows_uncorrectable", "remapped_rows_pending",
    "remapped_rows_failure", "retired_pages_sbe", "retired_pages_dbe", "retired_pages_pending",
    "ecc_errors_corrected", "ecc_errors_corrected_aggregate", "ecc_errors_uncorrected_aggregate",
    "pcie_replay_counter", "pcie_replay_rate", "memory_temperature", "memory_temperature_max", "energy_j",
    "energy_source", "nvlink_tx", "nvlink_rx", "nvlink_tx_total", "nvlink_rx_total", "nvlink_crc_flit_errors",
    "nvlink_crc_data_errors", "nvlink_replay_errors", "nvlink_recovery_errors", "clock_event_s",
    "throttled_power_pct", "throttled_thermal_pct", "throttled_hw_slowdown_pct", "gr_engine_active", "sm_active",
    "sm_occupancy", "tensor_active", "dram_active",
    # AMD's RAS counters: bad pages reserved, and those that could not be.
    "retired_pages_reserved", "retired_pages_failed",
    # What the driver asks to be done to recover the card.
    "recovery_action",
}
SCHEMA_PROC_KEYS = {"pid", "user", "command", "type", "gpu_memory", "sm_util", "cpu_percent", "rss", "started",
                    # Who owns the process (a Slurm job, a pod, a container, a unit, a user).
                    "owner",
                    # Its pid inside its container (its own PID namespace), else null.
                    "container_pid"}


def test_json_has_exactly_the_schema_keys():
    doc = DemoBackend().sample().to_dict()
    assert set(doc) == {"schema", "time", "host", "backend", "driver_version", "cuda_driver_version", "gpus"}
    for gpu in doc["gpus"]:
        assert set(gpu) == SCHEMA_GPU_KEYS
        for proc in gpu["processes"]:
            assert set(proc) == SCHEMA_PROC_KEYS
    json.dumps(doc)


def test_unknown_values_are_null_not_zero():
    gpu = GpuSample(index=0, uuid="GPU-x", name="n", pci_bus_id="b")
    doc = Snapshot(time=1.0, host="h", backend="nvml", driver_version=None, cuda_driver_version=None,
                   gpus=(gpu,)).to_dict()
    values = doc["gpus"][0]
    assert values["fan"] is None and values["throttle_reasons"] is None and values["processes"] == []
    assert gpu.memory_percent is None and gpu.power_percent is None


def test_round_trip_through_json():
    snap = DemoBackend().sample()
    again = Snapshot.from_dict(json.loads(json.dumps(snap.to_dict())))
    assert again == snap


def test_from_dict_rejects_other_schema_versions():
    doc = DemoBackend().sample().to_dict()
    doc["schema"] = 2
    with pytest.raises(ValueError, match="schema"):
        Snapshot.from_dict(doc)


def test_host_info_keeps_every_other_field():
    """with_host_info builds the sample field by field (for speed): it must equal replace(), so a
    field added to ProcessSample and not passed through fails here."""
    import dataclasses

    sample = ProcessSample(**{f.name: f"x-{f.name}" for f in dataclasses.fields(ProcessSample)})
    info = dict(user="u", command="c", cpu_percent=1.5, rss=2, started=3.0, uid=4, container="k",
                owner=ProcessOwner("user", "u"), container_pid=5)
    assert sample.with_host_info(**info) == dataclasses.replace(sample, **info)


def test_throttle_names():
    assert throttle_names(0) == ()
    assert throttle_names(0x1 | 0x40 | 0x80) == ("gpu_idle", "hw_thermal", "hw_power_brake")


def test_process_sample_is_frozen():
    p = ProcessSample(pid=1, type="compute")
    with pytest.raises(AttributeError):
        p.pid = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "total", "expected"),
    [("8G", None, 8 << 30), ("8GiB", None, 8 << 30), ("512M", None, 512 << 20), ("1024", None, 1024),
     ("50%", 80 << 30, 40 << 30), ("1.5g", None, int(1.5 * (1 << 30)))],
)
def test_parse_size(text, total, expected):
    assert parse_size(text, total) == expected


@pytest.mark.parametrize("text", ["", "G", "-1G", "0", "8X", "150%", "abc%", "0%"])
def test_parse_size_rejects(text):
    with pytest.raises(UsageError):
        parse_size(text, 1 << 30)


def test_relative_size_needs_a_total():
    with pytest.raises(UsageError, match="total"):
        parse_size("50%")


@pytest.mark.parametrize(("text", "seconds"), [("500ms", 0.5), ("30s", 30), ("10m", 600), ("1h", 3600)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "5x", "s", "-1s"])
def test_parse_duration_rejects(text):
    with pytest.raises(UsageError):
        parse_duration(text)


def test_cpu_lists_round_trip():
    assert format_cpu_list([0, 1, 2, 3, 8, 9, 32]) == "0-3,8-9,32"
    assert parse_cpu_list("0-3,8-9,32") == [0, 1, 2, 3, 8, 9, 32]
    assert format_cpu_list([]) == ""


def test_format_bytes():
    assert format_bytes(None) == "N/A"
    assert format_bytes(512) == "512B"
    assert format_bytes(3 << 30) == "3.0G"
    assert format_bytes(80 << 30) == "80G"
