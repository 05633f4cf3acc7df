"""The ledger's file among the people and hosts it concerns, through the real `gpumon watch` and
`gpumon report`: the system ledger root's watch writes is read by another (real) user while the
watch runs and after it stops; a ledger moved away or deleted under a running watch is noticed and a
new one started; the default file is one per host (two hosts sharing a home both record), and
`report` merges them; an old ledger is upgraded in place and answers as before."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import Card, require_tool
from test_claims_users import PYTHON, User, _version
from test_usage import INTERVAL, PERIOD, ledger_env, report, wait_for_rows, watch
from usage_history import HOST, WINDOWS, write_v1_ledger
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
    (line,) = err.splitlines()  # said once, in one line
    assert noticed < 60 and "moved away or deleted; a new one is started" in line
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("usage", "damaged")))
    moved = ["damaged.sqlite"] if how == "moved" else []
    assert leftovers == sorted(["usage.sqlite", "usage.sqlite.watch.lock", *moved])  # no journal left beside either
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


def _figures_match(new: dict, old: dict) -> None:
    """The same numbers, to the sums' rounding; `first` and `last` to the hour the minutes went into."""
    assert set(new) == set(old)
    for key, value in old.items():
        if key in ("first", "last") and value is not None:
            assert new[key] == value // 3600 * 3600, key
        elif isinstance(value, float) or key == "mean_memory":
            assert new[key] == pytest.approx(value, rel=1e-6, abs=1e-5), key
        else:
            assert new[key] == value, key


def test_an_old_ledger_is_upgraded_in_place_and_answers_as_before(held_card, tmp_path):
    """A format-1 ledger at the default place (before its name carried the host), three days old:
    read as it is, then made this host's file, upgraded and rolled up into hours by a watch; the
    report answers what the format-1 code answered on it (tests/data/usage_v1_answers.json)."""
    folder = Path(held_card.env["XDG_STATE_HOME"]) / "gpumon"
    folder.mkdir(parents=True)
    write_v1_ledger(folder / "usage.sqlite")
    config = tmp_path / "config.toml"
    config.write_text('[history]\nprice_per_kwh = 0.5\nkeep = "1000d"\nkeep_minutes = "1d"\n')
    env = {**held_card.env, "GPUMON_CONFIG": str(config), "GPUMON_HISTORY_PERIOD": PERIOD}
    expected = json.loads((Path(__file__).parent / "data" / "usage_v1_answers.json").read_text())
    asked = [(start, end, by) for start, end in WINDOWS for by in ("user", "job", "card", "day")]

    def answers() -> list[dict]:
        docs = []
        for start, end, by in asked:
            out = report(env, "--json", "--from", str(start), "--to", str(end), "--by", by)
            assert out.returncode == 0, out.stderr
            docs.append(json.loads(out.stdout))
        return docs

    for doc, old in zip(answers(), expected):  # not upgraded yet: read as it is, the same answers
        assert doc["resolution"] == 1
        assert {k: v for k, v in doc.items() if k not in ("time", "resolution", "hourly_before")} == old

    out = watch(env, "--count", "20")
    _, err = out.communicate(timeout=60)
    assert out.returncode == 0 and err == "", err
    (file,) = folder.glob("usage*.sqlite")
    assert file.name == f"usage.{socket.gethostname().split('.')[0]}.sqlite"
    with closing(sqlite3.connect(file)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (2,)
        assert conn.execute("SELECT count(*) FROM holder_minutes WHERE minute < ?", (WINDOWS[0][1],)).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM holder_hours").fetchone()[0] > 0

    for doc, old in zip(answers(), expected):
        assert doc["resolution"] == 3600 and doc["hourly_before"] > WINDOWS[0][1]
        assert len(doc["rows"]) == len(old["rows"])
        for new_row, old_row in zip(doc["rows"], old["rows"]):
            _figures_match(new_row, old_row)
        for new_day, old_day in zip(doc["days"], old["days"]):
            _figures_match(new_day, old_day)
        ours = [c for c in doc["cards"] if c["host"] == HOST]
        assert len(ours) == len(old["cards"])
        for new_card, old_card in zip(ours, old["cards"]):
            _figures_match(new_card, old_card)  # last use included, to the minute
    text = report(env, "--from", str(WINDOWS[0][0]), "--to", str(WINDOWS[0][1])).stdout
    assert "whole hours before" in text and "alice" in text
