"""A one-shot `gpumon health` knows the XIDs that came before it: a running `watch`'s (its state
file, 0600, written atomically), else the kernel log's `NVRM: Xid` lines (a file in /dev/kmsg's
record format here, as Documentation/ABI/testing/dev-kmsg gives it)."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
import time

import pytest
from conftest import Card
from test_jobs import wait_for

from gpumon.health.seen_xids import default_state_file

A100 = "NVIDIA A100-SXM4-80GB"


def kmsg_record(seq: int, seconds_ago: float, message: str) -> str:
    usec = max(0, int((time.monotonic() - seconds_ago) * 1e6))
    return f"4,{seq},{usec},-;{message}\n"


def health_json(fake_driver, *args: str) -> tuple[int, dict]:
    result = fake_driver.run("health", "--json", *args)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout)


def test_without_watch_health_reads_the_kernel_log(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(A100), Card(A100), Card(A100)]
    fake_driver.write()
    # A one-minute window: the record older than it must still be after boot (the records' clock
    # starts there), and a machine of the default ten minutes' uptime is not given.
    config = tmp_path / "config.toml"
    config.write_text('[health]\nwindow = "60s"\n')
    log = tmp_path / "kmsg"
    log.write_text(
        kmsg_record(1, 90, "NVRM: Xid (PCI:0000:10:00): 48, pid=77, name=python, DBE (double bit error)")  # too old
        + kmsg_record(2, 20, "NVRM: Xid (PCI:0000:10:00): 13, pid=78, Graphics Exception")  # the program's fault
        + kmsg_record(3, 10, "NVRM: Xid (PCI:0000:11:00): 79, pid=1234, name=python, GPU has fallen off the bus.")
        + " SUBSYSTEM=pci\n DEVICE=+pci:0000:11:00.0\n"
        + kmsg_record(4, 5, "usb 1-1: new high-speed USB device number 2 using xhci_hcd"))
    assert time.monotonic() > 90, "the too-old record needs a machine up for 90 s"
    status, doc = health_json(fake_driver, "--config", str(config), "--kernel-log", str(log))
    assert status == 2
    assert [g["health"]["verdict"] for g in doc["gpus"]] == ["ok", "fail", "ok"]
    assert [r["code"] for r in doc["gpus"][1]["health"]["reasons"]] == ["xid_79"]
    assert doc["xids_before"] == {"source": "kmsg", "detail": str(log), "xids": 2}  # within the window

    missing = fake_driver.run("health", "--json", "--kernel-log", str(tmp_path / "nope"))
    # A log named on the command line that is not there is the user's mistake, said at once.
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr == f"gpumon: error: --kernel-log {tmp_path / 'nope'}: No such file or directory\n"


def test_with_watch_running_health_takes_the_xids_it_heard(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(A100), Card(A100)]
    fake_driver.machine.xids = [dict(gpu=0, at=0.5, code=79)]
    fake_driver.write()
    empty = tmp_path / "kmsg"
    empty.write_text("")
    before = tmp_path / "kmsg-before"  # an XID on card 1 before watch started: the kernel log has it
    before.write_text(kmsg_record(1, 30, "NVRM: Xid (PCI:0000:11:00): 48, pid=1, DBE (double bit error)"))
    state = default_state_file()
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "watch", "--interval", "0.3", "--alert", "temp > 500"],
                             env=fake_driver.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: state.exists() and json.loads(state.read_text())["xids"], timeout=30,
                 what="watch to keep the XID it heard")
        assert stat.S_IMODE(state.stat().st_mode) == 0o600
        saved = json.loads(state.read_text())
        assert saved["pid"] == watch.pid and [(x["index"], x["code"]) for x in saved["xids"]] == [(0, 79)]
        status, doc = health_json(fake_driver, "--kernel-log", str(empty))
        assert status == 2 and doc["xids_before"]["source"] == "watch"
        assert [r["code"] for r in doc["gpus"][0]["health"]["reasons"]] == ["xid_79"]
        assert doc["gpus"][1]["health"]["verdict"] == "ok"
        status, doc = health_json(fake_driver, "--kernel-log", str(before))
        assert doc["xids_before"]["source"] == "watch" and doc["xids_before"]["xids"] == 2
        assert [[r["code"] for r in g["health"]["reasons"]] for g in doc["gpus"]] == [["xid_79"], ["xid_48"]]
    finally:
        watch.send_signal(signal.SIGTERM)
        watch.wait(timeout=30)
    # That watch has ended: its file is not taken for what happened; the kernel log is read instead.
    status, doc = health_json(fake_driver, "--kernel-log", str(empty))
    assert status == 0 and doc["xids_before"]["source"] == "kmsg"


def test_the_journal_where_the_kernel_refuses_kmsg(tmp_path, monkeypatch):
    """`journalctl -k -o json` (a stand-in printing what the journal prints) gives the XIDs since
    the window's start, binary messages (a list of bytes) included."""
    from gpumon.health.seen_xids import _journal

    now = time.time()
    lines = [{"MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
              "__REALTIME_TIMESTAMP": str(int((now - 60) * 1e6))},
             {"MESSAGE": list(b"NVRM: Xid (PCI:0000:3c:00): 48, pid=2, DBE \x1b[31m"),
              "__REALTIME_TIMESTAMP": str(int((now - 30) * 1e6))},
             {"MESSAGE": "usb 1-1: new device", "__REALTIME_TIMESTAMP": str(int(now * 1e6))}]
    journal = tmp_path / "journal.jsonl"
    journal.write_text("".join(json.dumps(line) + "\n" for line in lines))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    args = tmp_path / "args"
    stand_in = bin_dir / "journalctl"
    stand_in.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {args}\ncat {journal}\n")
    stand_in.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    seen = _journal(now - 600, "/dev/kmsg: permission denied")
    assert seen.source == "journal"
    assert [(x.code, x.pci) for x in seen.xids] == [(79, (0, 0x3b, 0)), (48, (0, 0x3c, 0))]
    assert seen.xids[0].when == pytest.approx(now - 60, abs=1)
    assert args.read_text().split() == ["-k", "-q", "--no-pager", "-o", "json", f"--since=@{int(now - 600)}"]
