"""The alert rule parser and state machine (pure: fed hand-made snapshots)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.alerting.rules import AlertEngine, RuleError, parse_rule
from gpumon.model import GpuSample, Snapshot
from gpumon.units import parse_size


def snap(t: float, *gpus: GpuSample) -> Snapshot:
    return Snapshot(time=t, host="h", backend="nvml", driver_version=None, cuda_driver_version=None, gpus=gpus)


def card(index: int = 0, **values) -> GpuSample:
    return GpuSample(index=index, uuid=f"GPU-{index}", name="Card", pci_bus_id=f"b{index}", **values)


def run(rule: str, series: list[tuple[float, dict]], index: int = 0):
    engine = AlertEngine([parse_rule(rule)])
    events = []
    for t, values in series:
        events += [(e.event, e.time) for e in engine.evaluate(snap(t, card(index, **values)))]
    return events


def test_fires_once_after_duration_and_resolves_once():
    temps = [70, 90, 90, 90, 90, 60, 95, 60, 60, 60, 60]
    events = run("temp > 85 for 2s", [(float(i), {"temperature": v}) for i, v in enumerate(temps)])
    # Hot from t=1; held 2 s at t=3. A one-sample dip at t=5 and the spike at t=6 do not flap it;
    # it is cool from t=7 and resolves 2 s later.
    assert events == [("firing", 3.0), ("resolved", 9.0)]


def test_without_duration_fires_and_resolves_immediately():
    events = run("util < 5", [(0, {"utilization_gpu": 50}), (1, {"utilization_gpu": 1}), (2, {"utilization_gpu": 9})])
    assert events == [("firing", 1), ("resolved", 2)]


def test_clear_value_gives_hysteresis():
    temps = [90, 84, 82, 79]
    events = run("temp > 85 clear 80", [(float(i), {"temperature": v}) for i, v in enumerate(temps)])
    assert events == [("firing", 0.0), ("resolved", 3.0)]


def test_unknown_values_never_change_state():
    events = run("temp > 85", [(0, {"temperature": 90}), (1, {"temperature": None}), (2, {"temperature": 90})])
    assert events == [("firing", 0)]


def test_percentages_and_sizes():
    total = 80 << 30
    assert run("mem >= 95%", [(0, {"memory_total": total, "memory_used": int(total * 0.96)})]) == [("firing", 0)]
    assert run("power > 90%", [(0, {"power_draw": 95.0, "power_limit": 100.0})]) == [("firing", 0)]
    assert run("power > 90", [(0, {"power_draw": 95.0, "power_limit": 300.0})]) == [("firing", 0)]
    assert run("mem_used > 8G", [(0, {"memory_used": 9 << 30})]) == [("firing", 0)]
    assert parse_rule("mem_used > 8G").threshold == parse_size("8G")


def test_on_limits_the_cards():
    engine = AlertEngine([parse_rule("temp > 50 on 1,2")])
    events = engine.evaluate(snap(0, card(0, temperature=90), card(1, temperature=90), card(3, temperature=90)))
    assert [e.gpu for e in events] == [1]


def test_lost_throttle_ecc_procs():
    assert run("lost", [(0, {}), (1, {"state": "lost"})]) == [("firing", 1)]
    assert run("throttle thermal", [(0, {"throttle_reasons": ("sw_power_cap",)}),
                                    (1, {"throttle_reasons": ("hw_thermal",)})]) == [("firing", 1)]
    assert run("throttle power", [(0, {"throttle_reasons": ("hw_power_brake",)})]) == [("firing", 0)]
    assert run("ecc > 0", [(0, {"ecc_errors_uncorrected": 0}), (1, {"ecc_errors_uncorrected": 2})]) == [("firing", 1)]
    from gpumon.model import ProcessSample
    procs = tuple(ProcessSample(pid=i, type="compute") for i in range(4))
    assert run("procs > 3", [(0, {"processes": procs})]) == [("firing", 0)]


def test_xid_fires_on_each_event_and_resolves_after_quiet():
    engine = AlertEngine([parse_rule("xid == 79 for 1s"), parse_rule("xid for 1s")])
    gpu = card(1)
    fired = engine.xid(gpu, 79, when=10.5)
    assert [(e.rule, e.value, e.time) for e in fired] == [("xid == 79 for 1s", 79, 10.5), ("xid for 1s", 79, 10.5)]
    assert [(e.rule, e.value) for e in engine.xid(gpu, 13, when=10.7)] == [("xid for 1s", 13)]  # each XID is news
    assert engine.evaluate(snap(11.0, gpu)) == []  # not quiet for long enough yet
    resolved = engine.evaluate(snap(11.8, gpu))
    assert [e.event for e in resolved] == ["resolved", "resolved"]
    assert [e.rule for e in engine.xid(gpu, 13, when=12)] == ["xid for 1s"]


def test_firing_lists_rules_per_card():
    engine = AlertEngine([parse_rule("temp > 50"), parse_rule("util > 50")])
    engine.evaluate(snap(0, card(0, temperature=90, utilization_gpu=90), card(1, temperature=10)))
    assert engine.firing() == {0: ("temp > 50", "util > 50")}


def test_event_json_has_the_design_keys():
    engine = AlertEngine([parse_rule("temp > 5")])
    (event,) = engine.evaluate(snap(3.0, card(2, temperature=9)))
    assert event.to_dict() == {"event": "firing", "rule": "temp > 5", "gpu": 2, "uuid": "GPU-2", "metric": "temp",
                               "value": 9, "threshold": 5, "time": 3.0, "host": "h"}


@pytest.mark.parametrize(
    ("rule", "caret_under"),
    [("temp >> 85", ">>"), ("tmp > 5", "tmp"), ("temp > hot", "hot"), ("temp > 5 for 3x", "3x"),
     ("throttle cold", "cold"), ("temp > 5 on a,b", "a,b"), ("temp > 5 fr 3s", "fr"), ("lost clear 3", "clear"),
     ("temp > 5%", "5%")],
)
def test_syntax_errors_point_at_the_bad_token(rule, caret_under):
    with pytest.raises(RuleError) as info:
        parse_rule(rule)
    _, shown, caret = str(info.value).splitlines()
    assert shown.strip() == rule
    start = caret.index("^")
    assert shown[start:start + len(caret_under)] == caret_under
    assert caret.count("^") == len(caret_under)


def test_missing_parts_are_errors():
    for rule in ["", "temp", "temp >", "throttle", "temp > 5 for"]:
        with pytest.raises(RuleError):
            parse_rule(rule)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_parses_or_is_a_rule_error(text):
    try:
        rule = parse_rule(text)
    except RuleError:
        return
    assert rule.metric


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.integers(0, 120)), max_size=40), st.sampled_from([0.0, 1.0, 3.0]))
def test_events_alternate_firing_and_resolved(values, duration):
    rule = parse_rule(f"temp > 80 for {duration:g}s" if duration else "temp > 80")
    engine = AlertEngine([rule])
    kinds = []
    for i, v in enumerate(values):
        kinds += [e.event for e in engine.evaluate(snap(float(i), card(0, temperature=v)))]
    assert kinds == ["firing", "resolved"] * (len(kinds) // 2) + (["firing"] if len(kinds) % 2 else [])


def test_rule_objects_are_immutable():
    rule = parse_rule("temp > 5")
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule.threshold = 3  # type: ignore[misc]
