"""Each kind of alert rule and each exported series is written once: every registered kind says how
it is evaluated and how (or why not) it is written in PromQL, and every series the exporter writes
and the Prometheus source reads comes back as the value it was."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from promlab import exposition

from gpumon.alerting.grammar import CARD, HOLDER, HOST, SHARED, XID
from gpumon.alerting.kinds import BY_WORD, KINDS
from gpumon.counters import CardCounters
from gpumon.exporter.collector import GpumonCollector
from gpumon.exporter.fields import CARD_FIELDS, LOST, MIB, read_back
from gpumon.exporter.health import HEALTH_FIELDS
from gpumon.fleet.prometheus.dcgm import FIELDS, read_cluster
from gpumon.fleet.prometheus.dcgm_health import COUNTER_FIELDS
from gpumon.model import GpuSample, Snapshot


def test_every_kind_says_how_it_is_evaluated_and_written_in_promql():
    for kind in KINDS:
        assert kind.scope in (CARD, XID, HOST, HOLDER, SHARED), kind.words
        assert (kind.promql is None) != (not kind.not_in_promql), kind.words  # one or the other, never both
        assert (kind.value is not None) == (kind.scope == CARD), kind.words
        assert kind.condition is not None or kind.whole is not None, kind.words
    assert len(BY_WORD) == sum(len(k.words) for k in KINDS)  # no word is two kinds'


def test_the_prometheus_source_reads_the_exporters_own_tables():
    assert FIELDS == read_back([*CARD_FIELDS, LOST])
    assert set(COUNTER_FIELDS) - {"gpumon_gpu_health"} == {f.name for f in HEALTH_FIELDS if f.reads_back}


def test_what_is_exported_reads_back_as_it_was():
    counters = CardCounters(memory_temperature=71, energy_j=123456.789, energy_source="driver", pcie_replay_counter=12,
                            remapped_rows_correctable=3, remapped_rows_uncorrectable=1, remapped_rows_pending=True,
                            remapped_rows_failure=False, retired_pages_sbe=2, retired_pages_dbe=1,
                            retired_pages_pending=False, ecc_errors_corrected=9)
    card = GpuSample(index=0, uuid="GPU-0", name="NVIDIA H100", pci_bus_id="00000000:17:00.0",
                     utilization_gpu=87, utilization_memory=40, memory_total=81559 * MIB, memory_used=62739 * MIB,
                     memory_free=18179 * MIB, temperature=66, fan=30, power_draw=412.5, power_limit=700.0,
                     clock_sm=1980, clock_mem=2619, encoder_util=0, decoder_util=5, ecc_errors_uncorrected=0,
                     pcie_tx=2048 * 1024, pcie_rx=1024 * 1024, throttle_reasons=("sw_power_cap", "hw_thermal"),
                     counters=counters)
    snap = Snapshot(time=0.0, host="node1", backend="nvml", driver_version=None, cuda_driver_version=None,
                    gpus=(card,))
    readings = []
    for family in text_string_to_metric_families(exposition(GpumonCollector(lambda: snap)).decode()):
        for sample in family.samples:
            readings.append(({**sample.labels, "__name__": sample.name}, sample.value))
    labels = {k: v for k, v in readings[0][0].items() if k != "__name__"}
    back = read_cluster(0.0, [(labels, 0.0)], readings, [], []).hosts["node1"].snapshot().gpus[0]
    for name in ("utilization_gpu", "utilization_memory", "memory_total", "memory_used", "memory_free",
                 "temperature", "fan", "power_draw", "power_limit", "clock_sm", "clock_mem", "encoder_util",
                 "decoder_util", "ecc_errors_uncorrected", "pcie_tx", "pcie_rx"):
        assert getattr(back, name) == getattr(card, name), name
    assert set(back.throttle_reasons) == set(card.throttle_reasons)
    for name in ("memory_temperature", "pcie_replay_counter", "remapped_rows_correctable",
                 "remapped_rows_uncorrectable", "remapped_rows_pending", "remapped_rows_failure", "retired_pages_sbe",
                 "retired_pages_dbe", "retired_pages_pending", "ecc_errors_corrected"):
        assert getattr(back.counters, name) == getattr(counters, name), name
    assert abs(back.counters.energy_j - counters.energy_j) < 1e-6


def test_unclaimed_takes_only_on_gpus():
    from gpumon.alerting.kinds import parse_rule
    from gpumon.alerting.rules import RuleError

    assert parse_rule("unclaimed").kind.scope == SHARED
    assert parse_rule("unclaimed on 0,1").gpus == {0, 1}
    with pytest.raises(RuleError, match="'unclaimed' takes only 'on GPUS'"):
        parse_rule("unclaimed for 5m")
