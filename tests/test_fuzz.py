"""Hostile and malformed input, generated: every input ends in a result or a UsageError, never
another exception (which the CLI would turn into an 'internal error')."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumon.cards.backends.demo import DemoBackend
from gpumon.cards.backends.replay import ReplayBackend
from gpumon.cards.recording import read_recording
from gpumon.cli import main
from gpumon.config import load_config
from gpumon.errors import UsageError
from gpumon.jobs.placement import resolve_spec
from gpumon.units import parse_cpu_list, parse_duration, parse_size

SNAPSHOT = DemoBackend(cards=8).sample()
TOPOLOGY = DemoBackend(cards=8).topology()
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

spec_text = st.one_of(
    st.text(max_size=40),
    st.lists(st.one_of(st.integers(-3, 12).map(str), st.sampled_from([g.uuid[:8] for g in SNAPSHOT.gpus]),
                       st.sampled_from(["auto", "auto:2", "auto:0", "auto:x", "MIG-", "0000:07:00.0", "", " "])),
             max_size=4).map(",".join),
)


@FUZZ
@given(spec_text)
def test_gpu_spec(text):
    try:
        cards = resolve_spec(text, SNAPSHOT, TOPOLOGY)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    assert cards and len({g.index for g in cards}) == len(cards)


@FUZZ
@given(st.one_of(st.text(max_size=20),
                 st.from_regex(r"-?\d{0,4}(\.\d{0,3})?\s*[kKmMgGtTpPxX]?(i?B)?%?", fullmatch=True)))
def test_size(text):
    try:
        value = parse_size(text, 80 << 30)
    except UsageError:
        return
    assert isinstance(value, int) and value > 0


@FUZZ
@given(st.text(max_size=20))
def test_duration_and_cpu_list(text):
    for parse in (parse_duration, parse_cpu_list):
        try:
            parse(text)
        except UsageError:
            pass


toml_values = st.one_of(st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=10), st.booleans(),
                        st.lists(st.text(max_size=12), max_size=3), st.lists(st.integers(), max_size=2))
toml_key = st.sampled_from(["interval", "theme", "readonly", "rules", "colour", "on_alert", "hook_timeout",
                            "format", "prometheus", "prometheus_processes"])


def _toml(value) -> str:
    return json.dumps(value) if not isinstance(value, bool) else str(value).lower()


@FUZZ
@given(st.lists(st.tuples(st.booleans(), toml_key, toml_values), max_size=6), st.text(max_size=30))
def test_config_files(tmp_path_factory, entries, junk):
    path = tmp_path_factory.mktemp("cfg") / "config.toml"
    top = [f"{k} = {_toml(v)}" for in_watch, k, v in entries if not in_watch]
    watch = [f"{k} = {_toml(v)}" for in_watch, k, v in entries if in_watch]
    for text in ("\n".join(top + ["[watch]"] + watch) + "\n", junk):
        path.write_text(text)
        try:
            load_config(str(path))
        except UsageError as exc:
            assert str(path) in str(exc)


@FUZZ
@given(st.lists(st.one_of(st.text(max_size=50), st.just(json.dumps(SNAPSHOT.to_dict())),
                          st.just(json.dumps({"schema": 2})), st.just('{"schema": 1, "gpus": [{"index": "x"}]}'),
                          st.just(json.dumps(SNAPSHOT.to_dict())[:-30])), max_size=6))
def test_recordings(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("rec") / "rec.jsonl"
    path.write_text("\n".join(lines))
    try:  # a file whose first snapshot is not one is not a recording at all: one line, exit 2
        good = list(read_recording(str(path)))
    except UsageError:
        good = None
    try:
        backend = ReplayBackend(str(path))
    except UsageError:
        assert not good
        return
    assert good is not None and len(backend.snapshots) == len(good)


def test_binary_garbage_recording(tmp_path):
    path = tmp_path / "rec.jsonl.gz"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(UsageError):
        ReplayBackend(str(path))


argument = st.one_of(st.sampled_from(["--interval", "--count", "--min-free", "--max-util", "--gpu", "--json",
                                      "--demo", "--seed", "--alert", "--format", "0", "-1", "abc", "1e9", "nan",
                                      "50%", "8G", "auto:3", "--", "workstation", "lost"]),
                     st.text(max_size=8))
command = st.sampled_from([["snapshot"], ["topo"], ["select"], ["alerts", "export", "--prometheus-rules"]])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command, st.lists(argument, max_size=5))
def test_cli_never_tracebacks(capsys, cmd, extra):
    status = main([*cmd, "--demo", *extra])
    out, err = capsys.readouterr()  # read per example, which also resets the capture
    assert status in (0, 1, 2), (cmd, extra, err)
    assert "Traceback" not in err and "internal error" not in err
    if status == 2:
        assert len(err.strip().splitlines()) in (1, 3)  # one line; alert rules add the rule and a caret

