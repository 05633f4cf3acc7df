"""The ledger's file among the people and hosts it concerns, through the real `gpumon watch` and
`gpumon report`: the system ledger root's watch writes is read by another (real) user while the
watch runs and after it stops; a ledger moved away or deleted under a running watch is noticed and a
new one started; the default file is one per host (two hosts sharing a home both record), and
`report` merges them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import Card, require_tool
from test_claims_users import PYTHON, User, _version
from test_usage import INTERVAL, PERIOD, ledger_env, report, wait_for_rows, watch
from usage_lab import two_users  # noqa: F401 - the fixture


@pytest.fixture
def held_card(fake_driver, idle_processes):
    proc = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card(extra={"power_mw": 100_000, "util": 40})]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=2 ** 30, sm=40)]
    fake_driver.write()
    return fake_driver


@pytest.fixture
def system_folder():
    """A root-owned folder other users may read, as systemd's StateDirectory= makes (0755)."""
    folder = Path(tempfile.mkdtemp(prefix="gpumon-system-ledger-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    return err


def test_another_user_reads_the_system_ledger_while_root_writes_it_and_after(held_card, system_folder,
                                                                             two_users):  # noqa: F811
    if not os.access(PYTHON, os.X_OK) or sys.version_info[:2] != _version(PYTHON):
        pytest.skip(f"{PYTHON} must be this Python's version, to use this venv's packages")
    db = system_folder / "usage.sqlite"
    config = system_folder / "config.toml"
    config.write_text(f'[history]\npath = "{db}"\n')
    env = {**held_card.env, "GPUMON_CONFIG": str(config), "GPUMON_HISTORY_PERIOD": PERIOD}
    reader = User(two_users.names[0], system_folder)
    try:
        def read() -> subprocess.CompletedProcess[str]:
            return reader.run("env", f"GPUMON_CONFIG={config}", PYTHON, "-m", "gpumon", "report", "--json",
                              "--since", "1h")

        writer = watch(env)
        wait_for_rows(db, "root")
        while_writing = read()
        stop(writer)
        after = read()
        assert os.stat(db).st_uid == 0 and reader.run("test", "-w", str(db)).returncode != 0  # they only read
    finally:
        shutil.rmtree(reader.home, ignore_errors=True)
    for out in (while_writing, after):
        assert out.returncode == 0, out.stderr
        assert [r["id"] for r in json.loads(out.stdout)["rows"]] == ["root"]
    assert json.loads(after.stdout)["cards"][0]["last_used"] is not None


@pytest.mark.parametrize("how", ["moved", "deleted"])
def test_a_ledger_moved_away_or_deleted_under_watch_is_noticed_and_a_new_one_started(held_card, tmp_path, how):
    db = tmp_path / "usage.sqlite"
    env = ledger_env(held_card, tmp_path, db)
    writer = watch(env)
    try:
        wait_for_rows(db, "root")
        if how == "moved":
            db.rename(tmp_path / "damaged.sqlite")
        else:
            db.unlink()
        gone = time.monotonic()
        wait_for_rows(db, "root", timeout=60)  # within a minute (a period here)
        noticed = time.monotonic() - gone
    finally:
        err = stop(writer)
    assert noticed < 60 and err == ""
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("usage", "damaged")))
    assert leftovers == sorted(["usage.sqlite", "usage.sqlite.watch.lock"] + (["damaged.sqlite"] if how == "moved" else []))
    if how == "moved":  # the file moved away is whole, and holds what was written before
        with sqlite3.connect(tmp_path / "damaged.sqlite") as conn:
            assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    out = report(env, "--json", "--since", "1h")
    assert out.returncode == 0 and [r["id"] for r in json.loads(out.stdout)["rows"]] == ["root"], out.stderr


def test_the_default_ledger_is_one_per_host_and_report_merges_them(held_card, tmp_path):
    """One home (XDG_STATE_HOME) shared by two hosts, as over NFS: each host's watch (its own host
    name, in its own UTS namespace) records its own file at once; neither silences the other."""
    require_tool("unshare")
    env = {**held_card.env, "GPUMON_HISTORY_PERIOD": PERIOD}
    folder = Path(env["XDG_STATE_HOME"]) / "gpumon"
    watches = [subprocess.Popen(["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', name, sys.executable,
                                 "-m", "gpumon", "watch", "--interval", INTERVAL, "--count", "30"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
               for name in ("node-a", "node-b")]
    errors = [w.communicate(timeout=90)[1] for w in watches]
    assert [w.returncode for w in watches] == [0, 0] and errors == ["", ""], errors
    assert sorted(p.name for p in folder.glob("usage*.sqlite")) == ["usage.node-a.sqlite", "usage.node-b.sqlite"]
    out = report(env, "--json", "--since", "1h")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert sorted((r["host"], r["id"]) for r in doc["rows"]) == [("node-a", "root"), ("node-b", "root")]
    assert sorted(c["host"] for c in doc["cards"]) == ["node-a", "node-b"]
    assert all(r["gpu_hours"] > 0 for r in doc["rows"])
    text = report(env, "--since", "1h").stdout
    assert "node-a: root" in text and "node-b: root" in text
