"""The driver's health events beyond XIDs (NVML's nvmlEventType*: ECC storms, DRAM retirement,
poison, GPU unavailable, recovery action), registered only where the card supports them (one type
a card lacks refuses the whole registration, in the fake driver as in the real one); each reaches
the verdict, `watch`'s events and its hooks."""

from __future__ import annotations

import json

from conftest import Card

A100 = "NVIDIA A100-SXM4-80GB"
EVERY_EVENT = "0xfe0e"  # XID, PState, DBE and every health event
FATAL_POISON, NONFATAL_POISON, RECOVERY = "0x2000", "0x1000", "0x8000"


def test_events_reach_the_verdict_watch_and_hooks(fake_driver, tmp_path):
    """Card 0: fatal poison (fail); card 1 supports XIDs only: its poison is never delivered, but its
    XID 79 is (the registration was not refused for the types it lacks); card 2: non-fatal poison
    (warn); card 3: the driver announces a node reboot (fail); card 4: a DRAM retirement on a card
    whose driver cannot say what it supports (XIDs only: nothing)."""
    m = fake_driver.machine
    m.cards = [Card(A100, extra=dict(events=EVERY_EVENT)), Card(A100, extra=dict(events="0x8")),
               Card(A100, extra=dict(events=EVERY_EVENT)), Card(A100, extra=dict(events=EVERY_EVENT)),
               Card(A100, extra=dict(events=EVERY_EVENT, fail="events"))]
    m.xids = [dict(gpu=0, at=0.5, type=FATAL_POISON, code=0), dict(gpu=1, at=0.5, type=FATAL_POISON, code=0),
              dict(gpu=1, at=0.8, code=79), dict(gpu=2, at=0.5, type=NONFATAL_POISON, code=0),
              dict(gpu=3, at=0.5, type=RECOVERY, code=2), dict(gpu=4, at=0.5, type="0x400", code=0)]
    fake_driver.write()
    hook_out = tmp_path / "hooks"
    result = fake_driver.run("watch", "--alert", "health", "--interval", "0.3", "--count", "12",
                             "--on-alert", f'printf "%s|%s\\n" "$GPUMON_GPU" "$GPUMON_REASONS" >> {hook_out}',
                             timeout=90)
    assert result.returncode == 0, result.stderr
    fired = {e["gpu"]: e for e in map(json.loads, result.stdout.splitlines()) if e["event"] == "firing"}
    assert set(fired) == {0, 1, 2, 3}, fired
    codes = {gpu: [r["code"] for r in e["reasons"]] for gpu, e in fired.items()}
    assert codes == {0: ["event_fatal_poison"], 1: ["xid_79"], 2: ["event_nonfatal_poison"],
                     3: ["event_recovery_action"]}
    assert (fired[0]["value"], fired[2]["value"], fired[3]["value"]) == (2, 1, 2)
    assert "uncontained poisoned memory" in fired[0]["reasons"][0]["text"]
    assert "node_reboot" in fired[3]["reasons"][0]["text"] and "reboot" in fired[3]["reasons"][0]["action"]
    hooked = hook_out.read_text()
    assert "0|event_fatal_poison: uncontained poisoned memory" in hooked
    assert "2|event_nonfatal_poison" in hooked


def test_a_driver_that_cannot_say_what_a_card_supports_still_gives_xids(fake_driver, build_fake):
    """nvmlDeviceGetSupportedEventTypes missing (an old driver): XIDs only are asked for, and come."""
    old = build_fake(omit=("nvmlDeviceGetSupportedEventTypes",))
    fake_driver.machine.cards = [Card(A100, extra=dict(events=EVERY_EVENT))]
    fake_driver.machine.xids = [dict(gpu=0, at=0.5, type=FATAL_POISON, code=0), dict(gpu=0, at=0.8, code=48)]
    fake_driver.write()
    result = fake_driver.run("--nvml-lib", str(old), "watch", "--alert", "health", "--interval", "0.3",
                             "--count", "10", timeout=90)
    assert result.returncode == 0, result.stderr
    fired = [json.loads(line) for line in result.stdout.splitlines()]
    assert [[r["code"] for r in e["reasons"]] for e in fired if e["event"] == "firing"] == [["xid_48"]]
