"""The XID policy as data (`[health.xid]`): codes added to and removed from the fatal ones, codes
that warn, "N times within D" thresholds — read by the verdict (`watch --alert health`, `gpumon
health`) and by failover alike; a bad table is one line naming the file and the key."""

from __future__ import annotations

import json

import pytest
from conftest import Card
from test_cli import assert_one_line_error
from test_failover import _stop_jobs_left_running, started_runs, starts_script, the_job, three_cards  # noqa: F401
from test_jobs import run_job, wait_for

from gpumon.health import rules as health_rules
from gpumon.health.xid import FATAL_XIDS

A100 = "NVIDIA A100-SXM4-80GB"
POLICY = """
[health.xid]
add_fatal = [13]
remove_fatal = [79]
warn = [31]
[[health.xid.threshold]]
code = 43
count = 3
within = "10m"
verdict = "fail"
"""


def test_the_default_policy_is_the_fatal_list():
    assert sorted(health_rules.HealthSettings().xid.fatal) == sorted(FATAL_XIDS) == [48, 63, 64, 74, 79, 92, 94, 95,
                                                                               119, 120]


def test_watch_judges_xids_by_the_sites_policy(fake_driver, tmp_path):
    """Card 0: XID 43 three times (a threshold: fail); card 1: XID 31 (warns); card 2: XID 79,
    removed from the fatal codes (nothing); card 3: XID 13, added to them (fail); card 4: XID 43
    twice (below the threshold: nothing)."""
    m = fake_driver.machine
    m.cards = [Card(A100) for _ in range(5)]
    m.xids = [dict(gpu=0, at=0.5, code=43), dict(gpu=0, at=0.8, code=43), dict(gpu=0, at=1.1, code=43),
              dict(gpu=1, at=0.5, code=31), dict(gpu=2, at=0.5, code=79), dict(gpu=3, at=0.5, code=13),
              dict(gpu=4, at=0.5, code=43), dict(gpu=4, at=0.8, code=43)]
    fake_driver.write()
    config = tmp_path / "policy.toml"
    config.write_text(POLICY)
    result = fake_driver.run("watch", "--alert", "health", "--interval", "0.3", "--count", "12",
                             "--config", str(config), timeout=90)
    assert result.returncode == 0, result.stderr
    fired = {}
    for line in result.stdout.splitlines():
        event = json.loads(line)
        if event["event"] == "firing":
            fired[event["gpu"]] = event  # the last firing of each card: its worst
    assert set(fired) == {0, 1, 3}, fired
    assert fired[0]["value"] == 2 and "xid_43_repeated" in [r["code"] for r in fired[0]["reasons"]]
    repeated = next(r for r in fired[0]["reasons"] if r["code"] == "xid_43_repeated")
    assert "3 times within 10 min" in repeated["text"]
    assert fired[1]["value"] == 1 and [r["code"] for r in fired[1]["reasons"]] == ["xid_31"]
    assert fired[3]["value"] == 2 and [r["code"] for r in fired[3]["reasons"]] == ["xid_13"]


@pytest.mark.parametrize("given", ["$GPUMON_CONFIG", "--config"])
def test_failover_reads_the_same_policy(fake_driver, tmp_path, monkeypatch, given):
    """XID 13, a program's own fault by default, fails the card when the site says so: the job moves.
    The policy is the file `gpumon run` read, however it was named (the supervisor is a gpumon of
    its own: --config is handed to it)."""
    config = tmp_path / "policy.toml"
    config.write_text(POLICY)
    if given == "$GPUMON_CONFIG":
        monkeypatch.setenv("GPUMON_CONFIG", str(config))
    named = ["--config", str(config)] if given == "--config" else []
    uuids = three_cards(fake_driver, busy=(2,))
    starts = tmp_path / "starts"
    run_job(fake_driver, *named, "--gpu", "0", "--failover", "1", "--", *starts_script(starts))
    started_runs(starts, 1)
    fake_driver.machine.xids = [dict(gpu=0, at=0, code=13)]
    fake_driver.write()
    (_, (_, given)) = started_runs(starts, 2)
    assert given == uuids[1]
    job = wait_for(lambda: (job := the_job(fake_driver))["state"] == "running" and job, what="running again")
    assert job["attempts"][0]["moved_because"].startswith("XID 13 on GPU 0: graphics engine exception")


@pytest.mark.parametrize(("table", "words"), [
    ("[health.xid]\nadd_fatal = 43\n", ("health.xid.add_fatal", "list of XID codes")),
    ("[health.xid]\nwarn = [\"43\"]\n", ("health.xid.warn",)),
    ("[health.xid]\nfatal = [43]\n", ("health.xid.fatal", "unknown key")),
    ("[[health.xid.threshold]]\ncode = 43\ncount = 3\nwithin = \"soon\"\n", ("health.xid.threshold", "within")),
    ("[[health.xid.threshold]]\ncode = 43\ncount = 0\nwithin = \"10m\"\n", ("health.xid.threshold", "count")),
    ("[[health.xid.threshold]]\ncode = 43\ncount = 3\nwithin = \"10m\"\nverdict = \"panic\"\n",
     ("health.xid.threshold", "verdict")),
])
def test_a_bad_policy_is_one_line_naming_the_file_and_key(fake_driver, tmp_path, table, words):
    fake_driver.machine.cards = [Card(A100)]
    fake_driver.write()
    config = tmp_path / "bad.toml"
    config.write_text(table)
    result = fake_driver.run("health", "--config", str(config))
    assert result.stdout == ""
    assert_one_line_error(result, 2, str(config), *words)


def test_failover_counts_a_threshold_per_card(fake_driver, tmp_path, monkeypatch):
    """XID 43 three times within 10 minutes fails the card for failover too (the verdict's test shows
    twice does not)."""
    config = tmp_path / "policy.toml"
    config.write_text(POLICY)
    monkeypatch.setenv("GPUMON_CONFIG", str(config))
    uuids = three_cards(fake_driver, busy=(2,))
    starts = tmp_path / "starts"
    run_job(fake_driver, "--gpu", "0", "--failover", "1", "--", *starts_script(starts))
    started_runs(starts, 1)
    fake_driver.machine.xids = [dict(gpu=0, at=0, code=43), dict(gpu=0, at=0.2, code=43),
                                dict(gpu=0, at=0.4, code=43)]
    fake_driver.write()
    (_, (_, given)) = started_runs(starts, 2)
    assert given == uuids[1]
    job = wait_for(lambda: (job := the_job(fake_driver))["state"] == "running" and job, what="running again")
    assert job["attempts"][0]["moved_because"].startswith("XID 43 on GPU 0: ") and "3 times within 10 min" in \
        job["attempts"][0]["moved_because"]
