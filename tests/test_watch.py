"""`gpumon watch` end to end against the fake driver: events, hooks, exit codes, config, record/replay."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import Card


def start_watch(fake_driver, *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpumon", "watch", *args], env=fake_driver.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def events_of(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def test_hot_card_fires_once_after_duration_then_resolves(fake_driver):
    m = fake_driver.machine
    m.cards = [Card("NVIDIA A30", extra=dict(temp=60)), Card("NVIDIA A30", extra=dict(temp=91)),
               Card("NVIDIA A30", extra=dict(temp=79))]
    fake_driver.write()
    proc = start_watch(fake_driver, "--alert", "temp > 80 for 2s", "--interval", "0.5", "--count", "24")
    first = json.loads(proc.stdout.readline())
    assert (first["event"], first["gpu"], first["metric"], first["value"], first["threshold"]) == (
        "firing", 1, "temp", 91, 80)
    m.cards[1].extra["temp"] = 50  # the card cools
    fake_driver.write()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rest = events_of(out)
    assert [(e["event"], e["gpu"]) for e in rest] == [("resolved", 1)]
    assert rest[0]["time"] - first["time"] >= 2.0
    assert first["uuid"].startswith("GPU-")


def test_firing_waits_for_the_duration(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(temp=95))]
    fake_driver.write()
    started = time.time()
    out = fake_driver.run("watch", "--alert", "temp > 80 for 2s", "--interval", "0.5", "--count", "8")
    (event,) = events_of(out.stdout)
    assert event["event"] == "firing"
    assert event["time"] - started >= 1.9


def test_lost_card_gives_one_lost_event_and_exit_on_alert(fake_driver):
    fake_driver.machine.cards = [Card(), Card(extra=dict(lost_after=1.0))]
    fake_driver.write()
    out = fake_driver.run("watch", "--alert", "lost", "--interval", "0.3", "--count", "12")
    assert out.returncode == 0
    assert [(e["event"], e["gpu"], e["metric"]) for e in events_of(out.stdout)] == [("firing", 1, "lost")]
    out = fake_driver.run("watch", "--alert", "lost", "--interval", "0.3", "--count", "30", "--exit-on-alert")
    assert out.returncode == 1 and len(events_of(out.stdout)) == 1


def test_xid_event_fires_between_samples(fake_driver):
    fake_driver.machine.cards = [Card(), Card()]
    fake_driver.machine.xids = [dict(gpu=1, at=1.2, code=79)]
    fake_driver.write()
    out = fake_driver.run("watch", "--alert", "xid == 79 for 5s", "--interval", "10", "--count", "2")
    events = events_of(out.stdout)
    assert events[0]["event"] == "firing" and events[0]["gpu"] == 1 and events[0]["value"] == 79
    # It came from the event thread: the second sample is 10 s after the first, but this is not.
    assert len(events) == 2 and events[1]["event"] == "resolved"
    assert events[1]["time"] - events[0]["time"] > 5


def test_hook_gets_the_event_without_shell_expansion(fake_driver, tmp_path):
    marker = tmp_path / "pwned"  # what the hostile names would create, relative to the cwd
    hostile = "$(touch pwned);rm -rf ~ `touch pwned`"  # card names are at most 96 bytes in NVML
    fake_driver.machine.cards = [Card(hostile, uuid="GPU-$(touch${IFS}pwned)", extra=dict(temp=99))]
    fake_driver.write()
    out_dir = tmp_path / "hook"
    out_dir.mkdir()
    hook = (f'cat > {out_dir}/stdin.json; printf "%s" "$GPUMON_NAME" > {out_dir}/name; '
            f'env | grep ^GPUMON_ > {out_dir}/env')
    result = fake_driver.run("watch", "--alert", "temp > 90", "--count", "2", "--interval", "0.2", "--on-alert", hook,
                             cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert (out_dir / "name").read_text() == hostile
    event = json.loads((out_dir / "stdin.json").read_text())
    assert event["uuid"] == "GPU-$(touch${IFS}pwned)" and event["event"] == "firing"
    env = (out_dir / "env").read_text()
    for var in ("GPUMON_EVENT=firing", "GPUMON_GPU=0", "GPUMON_METRIC=temp", "GPUMON_VALUE=99", "GPUMON_THRESHOLD=90"):
        assert var in env


def test_hanging_and_failing_hooks_do_not_stop_the_watch(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(extra=dict(temp=99)), Card(extra=dict(temp=99))]
    fake_driver.write()
    result = fake_driver.run("watch", "--alert", "temp > 90", "--count", "3", "--interval", "0.2",
                             "--on-alert", 'if [ "$GPUMON_GPU" = 0 ]; then sleep 60; else exit 3; fi',
                             "--hook-timeout", "0.5", timeout=30)
    assert result.returncode == 0
    assert len(events_of(result.stdout)) == 2
    assert "killed after 0.5s" in result.stderr and "status 3" in result.stderr


def test_sigterm_ends_cleanly_with_status_0(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(temp=99))]
    fake_driver.write()
    proc = start_watch(fake_driver, "--alert", "temp > 90", "--interval", "0.2")
    line = proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert json.loads(line)["event"] == "firing"
    assert "Traceback" not in err


def test_text_format_and_metrics_lines(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(temp=99, util=42))]
    fake_driver.write()
    out = fake_driver.run("watch", "--alert", "temp > 90", "--count", "2", "--interval", "0.2", "--format", "text",
                          "--metrics")
    lines = out.stdout.splitlines()
    assert any("FIRING" in line and "GPU 0" in line and "temp > 90" in line for line in lines)
    assert sum("gpu0 42%" in line for line in lines) == 2


def test_config_file_rules_and_errors(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(extra=dict(temp=70, util=3))]
    fake_driver.write()
    config = tmp_path / "gpumon.toml"
    config.write_text('interval = 0.2\n[watch]\nrules = ["util < 5"]\n')
    out = fake_driver.run("watch", "--config", str(config), "--alert", "temp > 60", "--count", "2")
    assert sorted(e["rule"] for e in events_of(out.stdout)) == ["temp > 60", "util < 5"]

    cases = [
        ('interval = 1\n[watch]\nrules = ["temp > 5"\n', "TOML syntax error"),
        ('interval = 1\ncolour = "red"\n', "line 2: unknown key 'colour'"),
        ('[watch]\nhook_timeout = "soon"\n', "line 2: 'watch.hook_timeout' must be int or float"),
        ('[watch]\nrules = ["temp >> 5"]\n', "alert rule"),
        ('interval = 0.01\n', "line 1"),
    ]
    for text, message in cases:
        config.write_text(text)
        result = fake_driver.run("watch", "--config", str(config), "--count", "1")
        assert result.returncode == 2, text
        assert message in result.stderr and str(config) in result.stderr or "alert rule" in result.stderr
        assert "Traceback" not in result.stderr
    missing = fake_driver.run("watch", "--config", str(tmp_path / "nope.toml"), "--count", "1")
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_gpumon_config_environment_variable(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(extra=dict(temp=70))]
    fake_driver.write()
    config = tmp_path / "c.toml"
    config.write_text('[watch]\nrules = ["temp > 60"]\n')
    env = dict(fake_driver.env, GPUMON_CONFIG=str(config))
    out = subprocess.run([sys.executable, "-m", "gpumon", "watch", "--count", "1"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert [e["rule"] for e in events_of(out.stdout)] == ["temp > 60"]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_replay_gives_the_same_events_as_the_live_run(fake_driver, tmp_path, suffix):
    m = fake_driver.machine
    m.cards = [Card(extra=dict(temp="40..95")), Card(extra=dict(temp=70, util="0..100")),
               Card(extra=dict(lost_after=2))]
    fake_driver.write()
    recording = tmp_path / f"rec{suffix}"
    rules = ["--alert", "temp > 80 for 1s", "--alert", "util < 20 for 500ms", "--alert", "lost"]
    live = fake_driver.run("watch", *rules, "--interval", "0.2", "--count", "30", "--record", str(recording))
    assert live.returncode == 0, live.stderr
    assert oct(recording.stat().st_mode & 0o777) == "0o600"
    replay = fake_driver.run("watch", *rules, "--replay", str(recording))
    assert replay.returncode == 0, replay.stderr
    assert events_of(replay.stdout) == events_of(live.stdout)
    assert len(events_of(live.stdout)) >= 3


def test_truncated_recording_is_replayed_up_to_the_last_whole_line(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(extra=dict(temp=99))]
    fake_driver.write()
    recording = tmp_path / "rec.jsonl"
    fake_driver.run("watch", "--interval", "0.2", "--count", "5", "--record", str(recording))
    data = recording.read_bytes()
    recording.write_bytes(data[: len(data) - 40])  # a crash in the middle of the last line
    out = fake_driver.run("watch", "--replay", str(recording), "--metrics")
    assert out.returncode == 0
    assert len([e for e in events_of(out.stdout) if e["event"] == "sample"]) == 4
    assert "skipped" in out.stderr and ":5:" in out.stderr


def test_recording_is_flushed_every_sample(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    recording = tmp_path / "rec.jsonl.gz"
    proc = start_watch(fake_driver, "--interval", "0.2", "--record", str(recording))

    def flushed() -> list[str]:
        lines: list[str] = []
        try:
            with gzip.open(recording, "rt") as f:
                for line in f:
                    lines.append(line)
        except (EOFError, OSError):  # the stream is still open; what was flushed is readable
            pass
        return lines

    # Three samples on disk while watch runs, before any clean shutdown could have flushed them.
    deadline = time.monotonic() + 30
    while len(flushed()) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.kill()  # no clean shutdown at all
    proc.wait()
    lines = flushed()
    assert len(lines) >= 3
    assert json.loads(lines[0])["schema"] == 1


def test_bad_recordings_are_usage_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("not json\n")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"schema": 99, "gpus": []}) + "\n")
    for path in (empty, other, tmp_path / "missing.jsonl"):
        out = subprocess.run([sys.executable, "-m", "gpumon", "watch", "--replay", str(path)],
                             capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert str(path) in out.stderr


def test_watch_without_rules_prints_nothing_and_exits_0(fake_driver):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    out = fake_driver.run("watch", "--count", "2", "--interval", "0.2")
    assert out.returncode == 0 and out.stdout == ""


def test_no_driver_in_watch_is_exit_3(tmp_path):
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "gpumon", "watch"], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 3 and "--demo" in out.stderr


def test_sigterm_stops_within_a_fixed_budget_whatever_the_hooks_queued(fake_driver, tmp_path):
    from gpumon.alerting.hooks import PARALLEL, STOP_BUDGET_S

    fake_driver.machine.cards = [Card(extra=dict(temp=99)) for _ in range(8)]
    fake_driver.write()
    ran = tmp_path / "ran"
    ran.mkdir()
    proc = start_watch(fake_driver, "--alert", "temp > 90", "--interval", "0.2", "--hook-timeout", "60",
                       "--on-alert", f'touch {ran}/$GPUMON_GPU; sleep 60')
    fired = [json.loads(proc.stdout.readline()) for _ in range(8)]
    assert {e["gpu"] for e in fired} == set(range(8))
    deadline = time.monotonic() + 20
    while len(list(ran.iterdir())) < PARALLEL and time.monotonic() < deadline:  # hooks at once: the rest queue
        time.sleep(0.05)
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=STOP_BUDGET_S + 30)
    took = time.monotonic() - started
    assert proc.returncode == 0, err
    assert took < STOP_BUDGET_S + 3, f"took {took:.1f} s to stop"  # one after another: 8 x 60 s
    assert err.count("alert hook killed: the watch is stopping") == PARALLEL, err
    assert err.count("alert hook not run: the watch is stopping") == 8 - PARALLEL, err
