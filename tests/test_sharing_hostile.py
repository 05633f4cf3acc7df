"""The shared place against a hostile user of the host (two real users; the tests run as root to
make them): whatever bob writes, holds or plants there, and whatever bob owns, alice's gpumon
keeps running, keeps claiming, and judges times by the kernel's clock, not by what bob wrote."""

from __future__ import annotations

import json
import os
import pwd
import time
from pathlib import Path

import pytest
import test_claims_users
from test_claims_users import User

from gpumon.sharing import reservations

NOW = time.time()
two_users = test_claims_users.two_users


def _uuids(user: User) -> list[str]:
    return [g["uuid"] for g in json.loads(user.gpumon("snapshot", "--json").stdout)["gpus"]]


def _poisons(card: str) -> dict[str, bytes]:
    """Content that made every gpumon command exit 70 (RecursionError, OverflowError, ValueError)."""
    return {
        "deep": b'{"card": "' + card.encode() + b'", "x": ' + b"[" * 1900 + b"]" * 1900 + b"}",
        "huge": b'{"card": "' + card.encode() + b'", "until": 1' + b"0" * 400 + b', "created": 1' + b"0" * 400
                + b', "since": 1' + b"0" * 400 + b', "index": 1' + b"0" * 400 + b', "pid": 1' + b"0" * 400 + b"}",
        "nan": b'{"card": "' + card.encode() + b'", "until": NaN, "created": NaN, "since": NaN, "job": NaN}',
        "inf": b'{"card": "' + card.encode() + b'", "until": Infinity, "created": -Infinity, "since": 1e999}',
        "digits": b'{"card": "' + card.encode() + b'", "until": 1' + b"0" * 5000 + b"}",
    }


def _fine(answer, *codes: int) -> None:
    assert answer.returncode in (codes or (0,)), answer.stderr
    assert "internal error" not in answer.stderr and "Traceback" not in answer.stderr, answer.stderr


def test_nothing_another_user_writes_in_the_place_crashes_anyones_gpumon(two_users):
    alice, bob = two_users
    uuids = _uuids(alice)
    place = alice.place
    for kind, body in _poisons(uuids[3]).items():
        if len(body) > 4096:
            body = body[:4096]  # cut: still no record
        for prefix in ("claim", "queue", "reserve"):
            bob.hold(place / f"{prefix}.{kind}.{kind}.0000", body)
    bob.run("mkfifo", str(place / f"claim.{uuids[2]}.fifo.0000"))
    bob.run("mkdir", str(place / f"reserve.{uuids[2]}.0000"))
    bob.run("ln", "-s", "/dev/zero", str(place / "queue.link.0000"))
    bob.run("sh", "-c", f"head -c 10000000 /dev/zero > {place}/reserve.big.0000")
    big = json.dumps({"card": uuids[1], "until": NOW + 3600, "created": NOW, "note": "x" * 9000}).encode()
    bob.hold(place / f"reserve.{uuids[1]}.big.0001", big)

    _fine(alice.gpumon("select"))
    _fine(alice.gpumon("reserve", "--list"))
    listed = alice.gpumon("reserve", "--list", "--json")
    _fine(listed)
    assert json.loads(listed.stdout)["reservations"] == []
    queued = alice.gpumon("queue", "--json")
    _fine(queued)
    assert json.loads(queued.stdout)["queue"] == []  # held files with no gpumon behind them: not in line
    doc = alice.gpumon("snapshot", "--json")
    _fine(doc)
    assert all(g["claims"] == [] and g["reservation"] is None for g in json.loads(doc.stdout)["gpus"])
    _fine(alice.gpumon("users"))
    _fine(alice.gpumon("watch", "--count", "2", "--format", "jsonl"))
    started = alice.gpumon("run", "--gpu", "auto", "--name", "train", "--", "sleep", "120")
    _fine(started)
    assert "on GPU 3" in started.stdout
    _fine(bob.gpumon("run", "--gpu", "auto", "--", "true"), 2)  # GPU 3 is alice's now


def test_the_folders_owner_is_named_with_the_fix_and_a_claim_removed_under_a_job_comes_back(two_users):
    """bob made the folder before anyone launched: it is his, and the sticky bit does not hold
    against him. alice is told, with the one command that fixes it; her job's claim, removed by
    bob, is made again by its supervisor."""
    alice, bob = two_users
    bobs = Path(alice.place.parent / f"{alice.place.name}-bobs")
    made = bob.run("mkdir", "-m", "1777", str(bobs))
    assert made.returncode == 0, made.stderr
    try:
        alice.place = bob.place = bobs
        started = alice.gpumon("run", "--gpu", "auto", "--interval", "0.2", "--name", "train", "--", "sleep", "120")
        _fine(started)
        assert f"{bobs} belongs to {bob.name}, who can remove anyone's claims" in started.stderr
        assert "install -d -m 1777 /run/gpumon" in started.stderr
        doctor = alice.gpumon("doctor")
        assert f"belongs to {bob.name}" in doctor.stdout + doctor.stderr
        claim = next(p for p in bobs.iterdir() if p.name.startswith("claim."))
        removed = bob.run("rm", "-f", str(claim))
        assert removed.returncode == 0 and not claim.exists()
        alice_uid = pwd.getpwnam(alice.name).pw_uid
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            again = [p for p in bobs.iterdir() if p.name.startswith("claim.") and p.stat().st_uid == alice_uid]
            if again:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the removed claim was not made again")
        refused = bob.gpumon("run", "--gpu", "auto", "--", "true")
        assert refused.returncode == 2 and f"claimed by {alice.name}" in refused.stderr
        # bob hides everyone's records from everyone but himself: writable, sticky, not listable.
        assert bob.run("chmod", "1733", str(bobs)).returncode == 0
        blind = alice.gpumon("run", "--gpu", "auto", "--", "true")
        assert blind.returncode == 2 and "cannot be listed" in blind.stderr and "--gpu auto is refused" in blind.stderr
    finally:
        for job in json.loads(alice.gpumon("jobs", "--json").stdout or "[]"):
            alice.gpumon("jobs", "--stop", job["id"])
        bob.run("rm", "-rf", str(bobs))


def test_a_reservations_times_are_the_kernels_not_what_its_file_says(two_users):
    alice, bob = two_users
    uuids = _uuids(alice)
    _fine(alice.gpumon("reserve", "--gpu", "3", "--for", "1h"))
    now = time.time()
    # "created": 0 would make bob's booking the first; an until in 2100 would pass the week's cap.
    bob.hold(bob.place / f"reserve.{uuids[3]}.early.0000",
             json.dumps({"card": uuids[3], "index": 3, "until": now + 3600, "created": 0}).encode())
    bob.hold(bob.place / f"reserve.{uuids[2]}.long.0000",
             json.dumps({"card": uuids[2], "index": 2, "until": 4102444800, "created": now}).encode())
    listed = {r["index"]: r for r in json.loads(bob.gpumon("reserve", "--list", "--json").stdout)["reservations"]}
    assert listed[3]["user"] == alice.name
    assert listed[2]["user"] == bob.name and listed[2]["until"] <= time.time() + 7 * 86400 + 1
    assert f"GPU 3 is reserved by {alice.name}" in bob.gpumon("run", "--gpu", "auto", "--", "true").stderr

    # A reservation's file changed after it was made (touch -d 2099 to look used forever) is none.
    booked = next(p for p in alice.place.iterdir() if p.name.startswith("reserve.") and p.stat().st_uid != 0
                  and p.stat().st_uid == pwd.getpwnam(alice.name).pw_uid)
    time.sleep(reservations.WRITTEN_WITHIN_S + 0.2)  # a change within that is the writing itself
    assert alice.run("touch", "-d", "2099-01-01", str(booked)).returncode == 0
    listed = json.loads(bob.gpumon("reserve", "--list", "--json").stdout)["reservations"]
    assert [r["user"] for r in listed if r["index"] == 3] == []


def test_touching_a_reservation_or_its_use_note_never_keeps_it_past_its_idle_release(two_users):
    """`touch -d 2099` on one's reservation (or on the note of its use) counted as use until 2099:
    now a change is the kernel's time of it, and an unused reservation ends for every reader."""
    alice, bob = two_users
    system = alice.home / "system.toml"
    system.write_text('[claims]\nidle_release = "3s"\n')
    os.chmod(alice.home, 0o755)
    host = (f"GPUMON_SYSTEM_CONFIG={system}",)
    _fine(alice.gpumon("reserve", "--gpu", "2", "--for", "1h", extra=host))
    booked = next(p for p in alice.place.iterdir() if p.name.startswith("reserve."))
    note = booked.with_name("reserve-use" + booked.name.removeprefix("reserve"))
    assert alice.run("touch", "-d", "2099-01-01", str(booked), str(note)).returncode == 0
    time.sleep(3.5)
    listed = json.loads(bob.gpumon("reserve", "--list", "--json", extra=host).stdout)["reservations"]
    assert listed == [], "unused for longer than the host's idle release, whatever the files' mtimes say"
    assert "GPU 2 skipped: reserved" not in bob.gpumon("select", "--verbose", extra=host).stderr


def test_a_queue_that_cannot_freeze(two_users):
    alice, bob = two_users
    never = alice.gpumon("run", "--wait", "--gpu", "auto:8", "--", "true")
    assert never.returncode == 2 and "this host has 4 that could run it" in never.stderr
    too_big = alice.gpumon("run", "--wait", "--min-free", "500G", "--", "true")
    assert too_big.returncode == 2 and "more than any card here has" in too_big.stderr

    # bob holds a queue file with no gpumon behind it: it is nobody in line.
    bob.hold(bob.place / "queue.fake.0000", json.dumps({"job": "fake", "gpu_spec": "auto:4", "count": 4}).encode())
    # alice queues for GPU 1 (busy): first in line; bob's later auto job may still start on GPU 3,
    # which alice's job can never use, without delaying her.
    _fine(alice.gpumon("run", "--wait", "--gpu", "1", "--interval", "0.2", "--name", "wants-1", "--", "sleep", "120"))
    _fine(bob.gpumon("run", "--wait", "--gpu", "auto", "--interval", "0.2", "--name", "any", "--", "sleep", "120"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        bobs = json.loads(bob.gpumon("jobs", "--json").stdout)
        if bobs and bobs[0]["state"] == "running":
            break
        time.sleep(0.2)
    assert bobs[0]["state"] == "running" and bobs[0]["gpu_indices"] == [3], bobs
    line = json.loads(bob.gpumon("queue", "--json").stdout)["queue"]
    assert [(e["user"], e["gpu_spec"]) for e in line] == [(alice.name, "1")]
    assert line[0]["reason"].startswith("first in line")
    alices = json.loads(alice.gpumon("jobs", "--json").stdout)
    assert alices[0]["state"] == "queued" and alices[0]["reason"], alices
