"""What another host sends is read field by field from the model's own dataclasses: a field added
to GpuSample, CardCounters or ProcessSample is read from other hosts, or named as not read, never
dropped without a word."""

from __future__ import annotations

import dataclasses
import json

import pytest

from gpumon.counters import CLOCK_EVENT_TIMES, CardCounters, Health, HealthReason
from gpumon.fleet.schema import GPU_APART, fields_by_type, snapshot_from_remote
from gpumon.model import FABRIC_STATES, GpuSample, ProcessOwner, ProcessSample, Snapshot

# model._gpu_to_dict leaves them out
NEVER_SENT = {"error": None, "mig_devices": (), "vendor_index": None, "minor_number": None, "allocated_to": None}
BY_TYPE = {"int | None": 7, "float | None": 2.5, "str | None": "some text", "bool | None": True}


def filled(cls, **given):
    """Every field of `cls` set to a value of its type (None and defaults would hide a field left out)."""
    values = {f.name: BY_TYPE[f.type] for f in dataclasses.fields(cls) if f.type in BY_TYPE}
    return cls(**(values | given))


def test_every_field_a_card_sends_is_read_back():
    counters = filled(CardCounters, energy_source="driver", recovery_action="gpu_reset",
                      clock_event_s=tuple(1.0 + i for i in range(len(CLOCK_EVENT_TIMES))))
    process = filled(ProcessSample, pid=42, type="compute", uid=None, container=None,  # uid, container: not sent
                     owner=ProcessOwner(kind="slurm", id="4242", name="train", user="alice", engine=None))
    card = filled(GpuSample, index=0, uuid="GPU-1", name="A100", pci_bus_id="00000000:07:00.0", state="stale",
                  processes=(process,), throttle_reasons=("sw_power_cap",), fabric=FABRIC_STATES[0], mig_mode=True,
                  vendor="amd", counters=counters, health=Health("warn", (HealthReason("x", "y", "z"),)),
                  **NEVER_SENT)
    sent = Snapshot(time=1.0, host="a", backend="nvml", driver_version="550", cuda_driver_version="12.4", gpus=(card,))
    assert snapshot_from_remote(json.loads(json.dumps(sent.to_dict()))) == sent


def test_a_new_field_is_read_by_its_type_or_refused_until_named():
    def with_field(name, annotation):
        extra = [(f.name, f.type, f) for f in dataclasses.fields(GpuSample)] + [(name, annotation, None)]
        return dataclasses.make_dataclass("GpuSample", extra)

    ints, floats, texts = fields_by_type(with_field("hotspot", "int | None"), GPU_APART,
                                         "int | None", "float | None", "str | None")
    assert "hotspot" in ints and "hotspot" not in floats + texts
    with pytest.raises(TypeError, match=r"GpuSample.throttling_now \(bool \| None\)"):
        fields_by_type(with_field("throttling_now", "bool | None"), GPU_APART,
                       "int | None", "float | None", "str | None")
    assert fields_by_type(with_field("throttling_now", "bool | None"), GPU_APART | {"throttling_now"},
                          "int | None", "float | None", "str | None") == fields_by_type(
        GpuSample, GPU_APART, "int | None", "float | None", "str | None")
