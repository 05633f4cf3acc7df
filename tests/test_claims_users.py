"""Claims between two real users of one host (the tests run as root: they make the users): the
claimant is who the kernel says owns the claim, and nobody can remove another's."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from conftest import end_users_processes, require_tool

# Other users cannot run a Python under root's home (a pyenv venv): Debian's /usr/bin/python3
# (REAL-MANAGERS.md), given this checkout and the venv's packages, which they can read.
PYTHON = "/usr/bin/python3"
SITE = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
SOURCE = str(Path(__file__).resolve().parent.parent)


class User:
    def __init__(self, name: str, place: Path) -> None:
        self.name = name
        self.place = place
        self.home = Path(tempfile.mkdtemp(prefix=f"gpumon-{name}-"))
        entry = pwd.getpwnam(name)
        os.chown(self.home, entry.pw_uid, entry.pw_gid)

    def run(self, *args: str, timeout: float = 60, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        env = [*extra, f"HOME={self.home}", f"XDG_STATE_HOME={self.home}/state", f"XDG_CONFIG_HOME={self.home}/config",
               f"GPUMON_CLAIMS_DIR={self.place}", "TZ=UTC", f"PATH={os.environ['PATH']}",
               f"PYTHONPATH={':'.join([SOURCE, *SITE])}"]
        return subprocess.run(["runuser", "-u", self.name, "--", "env", "-i", *env, *args],
                              capture_output=True, text=True, timeout=timeout, cwd="/")

    def gpumon(self, *args: str, timeout: float = 60, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
        return self.run(PYTHON, "-m", "gpumon", "--demo", *args, timeout=timeout, extra=extra)

    def hold(self, path: Path, content: bytes) -> subprocess.Popen[str]:
        """A process of this user's that writes `content` at `path` and holds an flock on it."""
        code = ("import fcntl, os, sys, time; p = sys.argv[1]; "
                "fd = os.open(p + '.tmp', os.O_CREAT | os.O_WRONLY, 0o644); fcntl.flock(fd, fcntl.LOCK_EX); "
                "os.write(fd, bytes.fromhex(sys.argv[2])); os.rename(p + '.tmp', p); print('held', flush=True); "
                "time.sleep(300)")
        holder = subprocess.Popen(["runuser", "-u", self.name, "--", PYTHON, "-c", code, str(path), content.hex()],
                                  stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        return holder


def _version(python: str) -> tuple[int, int]:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True)
    major, minor = out.stdout.split()
    return int(major), int(minor)


@pytest.fixture
def two_users():
    require_tool("useradd")
    require_tool("runuser")
    if os.geteuid() != 0:
        pytest.skip("making users needs root")
    if not os.access(PYTHON, os.X_OK) or sys.version_info[:2] != _version(PYTHON):
        pytest.skip(f"{PYTHON} must be this Python's version, to use this venv's packages")
    tag = secrets.token_hex(3)
    names = [f"alice{tag}", f"bob{tag}"]
    place = Path(tempfile.mkdtemp(prefix="gpumon-claims-"))
    os.chmod(place, 0o1777)
    for name in names:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    users = [User(name, place) for name in names]
    try:
        yield users
    finally:
        for user in users:
            listed = user.gpumon("jobs", "--json")
            for job in json.loads(listed.stdout or "[]"):
                for pid in (job.get("pid"),):
                    if job["state"] == "running" and pid:
                        user.gpumon("jobs", "--stop", job["id"])
        # Only then the homes: a stopped job's supervisor still writes its exit record there.
        end_users_processes(*(user.name for user in users))
        for user in users:
            shutil.rmtree(user.home, ignore_errors=True)
            subprocess.run(["userdel", user.name], capture_output=True)
        shutil.rmtree(place, ignore_errors=True)


def test_bob_cannot_remove_alices_claim_and_is_told_who_holds_the_card(two_users):
    alice, bob = two_users
    started = alice.gpumon("run", "--gpu", "auto", "--name", "train.py", "--", "sleep", "120")
    assert started.returncode == 0, started.stderr
    job = json.loads(alice.gpumon("jobs", "--json").stdout)[0]
    assert job["gpu_indices"] == [3]  # the demo's one free card
    claim = next(p for p in alice.place.iterdir() if p.name.startswith("claim."))
    assert claim.stat().st_uid == pwd.getpwnam(alice.name).pw_uid

    removed = bob.run("rm", "-f", str(claim))
    assert removed.returncode != 0 and "Operation not permitted" in removed.stderr
    assert claim.exists()
    moved = bob.run("mv", str(claim), str(alice.place / "gone"))
    assert moved.returncode != 0 and claim.exists()

    refused = bob.gpumon("run", "--gpu", "auto", "--", "true")
    assert refused.returncode == 2
    assert f"GPU 3 is claimed by {alice.name}: job {job['id']} train.py, since " in refused.stderr
    select = bob.gpumon("select", "--verbose")
    assert f"GPU 3 skipped: claimed by {alice.name}: job {job['id']} train.py" in select.stderr

    doc = json.loads(bob.gpumon("snapshot", "--json").stdout)
    assert [c["user"] for c in doc["gpus"][3]["claims"]] == [alice.name]


def test_a_claim_names_whoever_owns_it_whatever_it_says(two_users):
    """bob writes a claim that says it is alice's: it is bob's."""
    alice, bob = two_users
    uuid = json.loads(bob.gpumon("snapshot", "--json").stdout)["gpus"][3]["uuid"]
    record = json.dumps({"card": uuid, "job": "forged", "name": "x", "user": alice.name, "since": time.time()})
    code = ("import fcntl, os, sys, time; p = sys.argv[1]; "
            "fd = os.open(p + '.tmp', os.O_CREAT | os.O_WRONLY, 0o644); fcntl.flock(fd, fcntl.LOCK_EX); "
            "os.write(fd, sys.argv[2].encode()); os.rename(p + '.tmp', p); print('held', flush=True); time.sleep(120)")
    holder = subprocess.Popen(["runuser", "-u", bob.name, "--", PYTHON, "-c", code,
                               str(bob.place / f"claim.{uuid}.forged.0000"), record],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        doc = json.loads(alice.gpumon("snapshot", "--json").stdout)
        assert [c["user"] for c in doc["gpus"][3]["claims"]] == [bob.name]
    finally:
        for proc in [*psutil.Process(holder.pid).children(recursive=True), psutil.Process(holder.pid)]:
            proc.send_signal(signal.SIGKILL)  # runuser's child first: it holds the lock
        holder.wait()
    # Its holder gone, the claim is stale: everyone ignores it (only bob could remove the file).
    doc = json.loads(alice.gpumon("snapshot", "--json").stdout)
    assert doc["gpus"][3]["claims"] == []


def test_alices_reservation_is_skipped_by_bob_and_only_alice_can_release_it(two_users):
    alice, bob = two_users
    made = alice.gpumon("reserve", "--gpu", "3", "--for", "1h", "--note", "<i>deadline</i>")
    assert made.returncode == 0, made.stderr
    refused = bob.gpumon("run", "--gpu", "auto", "--", "true")
    assert refused.returncode == 2
    assert f'GPU 3 is reserved by {alice.name} until ' in refused.stderr and '"<i>deadline</i>"' in refused.stderr
    assert "GPU 3 skipped: reserved by" in bob.gpumon("select", "--verbose").stderr
    taken = bob.gpumon("reserve", "--gpu", "3", "--for", "1h")
    assert taken.returncode == 2 and f"GPU 3 is reserved by {alice.name}" in taken.stderr
    assert "no reservation" in bob.gpumon("release", "--gpu", "3").stdout
    booked = next(p for p in alice.place.iterdir() if p.name.startswith("reserve."))
    assert bob.run("rm", "-f", str(booked)).returncode != 0 and booked.exists()
    listed = json.loads(bob.gpumon("reserve", "--list", "--json").stdout)["reservations"]
    assert [(r["index"], r["user"]) for r in listed] == [(3, alice.name)]
    assert alice.gpumon("select").returncode == 0  # hers to use
    assert alice.gpumon("release").stdout.startswith("released GPU 3")
    assert bob.gpumon("select").returncode == 0


def _short_release(user: User) -> str:
    """A config of `user`'s own that asks for a reservation's release after 1 s unused."""
    config = user.home / "short.toml"
    config.write_text('[claims]\nidle_release = "1s"\n')
    return str(config)


def _listed(user: User, *config: str) -> list[tuple[int, str]]:
    answer = user.gpumon(*config, "reserve", "--list", "--json")
    assert answer.returncode == 0, answer.stderr
    return sorted((r["index"], r["user"]) for r in json.loads(answer.stdout)["reservations"])


def test_a_reservation_is_judged_by_the_same_rule_whoever_reads_it(two_users):
    """A reader's own `[claims] idle_release` never decides whether another's reservation stands
    (bob's 1 s neither hides alice's from his list, as his `select` still skips her card, nor
    removes his own older one); a holder's own shorter release is written in the reservation, and
    ends it for every reader."""
    alice, bob = two_users
    assert alice.gpumon("reserve", "--gpu", "3", "--for", "1h").returncode == 0
    assert bob.gpumon("reserve", "--gpu", "2", "--for", "1h").returncode == 0
    time.sleep(2.5)  # both unused for longer than bob's own idle release
    short = ("--config", _short_release(bob))
    assert _listed(bob, *short) == [(2, bob.name), (3, alice.name)]
    assert "GPU 3 skipped: reserved by" in bob.gpumon(*short, "select", "--verbose").stderr
    assert len([p for p in bob.place.iterdir() if p.name.startswith("reserve.")]) == 2  # none removed

    made = alice.gpumon("--config", _short_release(alice), "reserve", "--gpu", "1", "--for", "1h")
    assert made.returncode == 0, made.stderr
    time.sleep(2.5)
    assert _listed(bob) == _listed(alice) == [(2, bob.name), (3, alice.name)]
    assert "GPU 1 skipped: reserved" not in bob.gpumon("select", "--verbose").stderr


def test_snapshot_says_who_has_each_card_and_reads_ones_own_as_ones_own(two_users):
    alice, bob = two_users
    assert alice.gpumon("reserve", "--gpu", "3", "--for", "1h", "--note", "paper").returncode == 0
    theirs = bob.gpumon("snapshot")
    assert f'GPU 3: reserved by {alice.name} until ' in theirs.stdout and '"paper"' in theirs.stdout
    ours = alice.gpumon("snapshot")
    assert "GPU 3: reserved by you until " in ours.stdout
