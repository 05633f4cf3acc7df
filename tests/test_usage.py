"""The usage ledger end to end: a real `gpumon watch` over the fake driver records two real users'
processes (made with useradd, run with runuser) into SQLite, is restarted midway, and `gpumon
report` answers what ran: GPU-seconds within the run's length, the idle one's idle-held time, each
card's last use. A damaged file, a read-only folder and two writers at once never stop watch."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import GIB, Card
from usage_lab import two_users  # noqa: F401 - the fixture

USER_ROWS = "holder_minutes r JOIN holders h ON h.id = r.holder AND h.kind = 'user' WHERE 1"
PERIOD = "1"  # GPUMON_HISTORY_PERIOD: rows per second instead of per minute, to keep tests fast
INTERVAL = "0.1"


def ledger_env(fake_driver, tmp_path: Path, db: Path) -> dict[str, str]:
    config = tmp_path / "config.toml"
    config.write_text(f'[history]\npath = "{db}"\nprice_per_kwh = 0.5\n')
    return {**fake_driver.env, "GPUMON_CONFIG": str(config), "GPUMON_HISTORY_PERIOD": PERIOD}


def watch(env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpumon", "watch", "--interval", INTERVAL, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumon", "report", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def wait_for_rows(db: Path, user: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if db.exists():
            try:
                with closing(sqlite3.connect(db)) as conn:  # closed: an open one keeps the writer's WAL
                    if conn.execute("SELECT count(*) FROM holder_minutes r JOIN holders h ON h.id = r.holder "
                                    "WHERE h.holder = ?", (user,)).fetchone()[0]:
                        return
            except sqlite3.Error:
                pass
        time.sleep(0.05)
    raise AssertionError(f"no rows of {user} in {db}")


@pytest.fixture
def two_holders(fake_driver, two_users):  # noqa: F811 - the fixture imported above
    """User a computes on card 0 (80 % SM), user b holds card 1 at 0 %."""
    busy, idle = (two_users.spawn(name) for name in two_users.names)
    fake_driver.machine.cards = [Card(extra={"power_mw": 200_000, "util": 80}),
                                 Card(extra={"power_mw": 50_000, "util": 0})]
    fake_driver.machine.procs = [dict(gpu=0, pid=busy, mem=4 * GIB, sm=80), dict(gpu=1, pid=idle, mem=2 * GIB, sm=0)]
    fake_driver.write()
    return two_users.names


def test_watch_records_two_users_across_a_restart_and_report_answers_what_ran(fake_driver, tmp_path, two_holders):
    a, b = two_holders
    db = tmp_path / "usage" / "usage.sqlite"
    env = ledger_env(fake_driver, tmp_path, db)
    began = time.monotonic()
    first = watch(env)
    wait_for_rows(db, b)  # a minute (a period here) is written, then watch is stopped midway
    time.sleep(1.0)
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 0, err
    second = watch(env, "--count", "20")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0 and err == "", err
    ran = time.monotonic() - began

    out = report(env, "--json", "--since", "1h")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    users = {r["id"]: r for r in doc["rows"] if r["kind"] == "user"}
    assert set(users) == {a, b}
    busy, idle = users[a], users[b]
    for row in (busy, idle):  # each held one card for about as long as the watches ran, never more
        assert 2.0 / 3600 < row["gpu_hours"] <= ran / 3600
        assert row["peak_memory"] == (4 if row is busy else 2) * GIB
    assert busy["mean_sm"] == pytest.approx(80) and busy["idle_hours"] == 0
    assert idle["mean_sm"] == 0 and idle["idle_hours"] == pytest.approx(idle["gpu_hours"], abs=1e-4)
    assert busy["energy_kwh"] == pytest.approx(200 * busy["gpu_hours"] / 1000, rel=0.05)
    assert busy["cost"] == pytest.approx(busy["energy_kwh"] * 0.5, abs=1e-4)
    cards = {c["index"]: c for c in doc["cards"]}
    assert set(cards) == {0, 1} and all(c["last_used"] is not None for c in cards.values())
    assert cards[0]["mean_util"] == pytest.approx(80) and cards[1]["mean_util"] == 0

    # The file is plain SQLite, with a rollback journal (readers need only read access).
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        held = conn.execute(f"SELECT sum(held_s) FROM {USER_ROWS} AND h.holder = ?", (b,)).fetchone()[0]
    assert held == pytest.approx(idle["gpu_hours"] * 3600, abs=0.5)

    text = report(env, "--since", "1h", "--plot")
    assert text.returncode == 0 and a in text.stdout and "LAST USED" in text.stdout and "utilisation" in text.stdout
    by_card = json.loads(report(env, "--json", "--by", "card").stdout)["rows"]
    assert sorted(r["index"] for r in by_card) == [0, 1]
    (day,) = json.loads(report(env, "--json", "--by", "day").stdout)["rows"]
    assert day["gpu_hours"] == pytest.approx(busy["gpu_hours"] + idle["gpu_hours"], abs=1e-3)
    csv = report(env, "--csv").stdout.splitlines()
    assert csv[0].startswith("host,kind,id,label,user") and len(csv) == 3


def test_bad_report_input_is_one_line_and_status_2(tmp_path):
    for args in (["--since", "7x"], ["--from", "yesterday"], ["--by", "group"], ["--from", "2026-12-02", "--to",
                                                                                   "2026-12-01"],
                 ["--since", "7d", "--from", "2026-12-01"]):
        out = subprocess.run([sys.executable, "-m", "gpumon", "report", *args], capture_output=True, text=True)
        assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, (args, out)
    missing = subprocess.run([sys.executable, "-m", "gpumon", "report"], capture_output=True, text=True)
    assert missing.returncode == 1 and "no usage history" in missing.stderr


def test_a_damaged_ledger_is_one_line_and_watch_goes_on_alerting(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(extra={"temp": 95})]
    fake_driver.write()
    db = tmp_path / "usage.sqlite"
    db.write_bytes(b"this is not a database, " * 400)
    out = watch(ledger_env(fake_driver, tmp_path, db), "--alert", "temp > 90", "--count", "15")
    stdout, stderr = out.communicate(timeout=60)
    assert out.returncode == 0
    assert [json.loads(line)["event"] for line in stdout.splitlines()] == ["firing"]
    (line,) = stderr.splitlines()
    assert str(db) in line and "not a database" in line
    assert report(ledger_env(fake_driver, tmp_path, db)).returncode == 1


def test_a_locked_ledger_is_one_line_and_watch_goes_on_alerting(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(extra={"temp": 95})]
    fake_driver.write()
    db = tmp_path / "usage.sqlite"
    env = ledger_env(fake_driver, tmp_path, db)
    first = watch(env, "--count", "5")  # the file, its tables
    assert first.communicate(timeout=60)[0] == "" and first.returncode == 0
    holder = sqlite3.connect(db, isolation_level=None)  # another program holds the write lock all along
    holder.execute("BEGIN EXCLUSIVE")
    try:
        out = watch(env, "--alert", "temp > 90", "--count", "20")
        stdout, stderr = out.communicate(timeout=60)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert out.returncode == 0
    assert [json.loads(line)["event"] for line in stdout.splitlines()] == ["firing"]
    (line,) = stderr.splitlines()
    assert str(db) in line and "locked" in line


@pytest.mark.parametrize("folder_is", ["read-only", "full"])
def test_a_read_only_or_full_folder_is_one_line_and_watch_goes_on(fake_driver, tmp_path, folder_is):
    folder = tmp_path / "mounted"
    folder.mkdir()
    options = "ro,size=1m" if folder_is == "read-only" else "size=64k"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {mounted.stderr.decode().strip()}")
    try:
        if folder_is == "full":  # a few KiB left: the database's first pages do not fit
            (folder / "filler").write_bytes(b"\0" * 60 * 1024)
        fake_driver.machine.cards = [Card(extra={"temp": 95})]
        fake_driver.write()
        out = watch(ledger_env(fake_driver, tmp_path, folder / "usage.sqlite"), "--alert", "temp > 90", "--count", "15")
        stdout, stderr = out.communicate(timeout=60)
    finally:
        subprocess.run(["umount", str(folder)], check=True)
    assert out.returncode == 0 and len(stdout.splitlines()) == 1
    (line,) = stderr.splitlines()
    assert "usage history" in line and ("Read-only file system" if folder_is == "read-only" else "full") in line


def test_two_watches_at_once_count_a_minute_once(fake_driver, tmp_path, two_holders):
    a, _ = two_holders
    db = tmp_path / "usage.sqlite"
    env = ledger_env(fake_driver, tmp_path, db)
    began = time.monotonic()
    first = watch(env)
    wait_for_rows(db, a)
    second = watch(env, "--count", "10")
    _, err = second.communicate(timeout=60)
    assert second.returncode == 0 and "another gpumon watch records it" in err
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=30)
    ran = time.monotonic() - began
    busy = next(r for r in json.loads(report(env, "--json").stdout)["rows"] if r["id"] == a)
    assert 0 < busy["gpu_hours"] * 3600 <= ran  # counted by the first alone, not twice


def test_the_tui_records_where_no_watch_does_and_hands_over_to_one(fake_driver, tmp_path, two_holders,
                                                                    tmux_session):
    import shlex

    a, b = two_holders
    db = tmp_path / "usage.sqlite"
    env = ledger_env(fake_driver, tmp_path, db)
    passed = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()
                      if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME",
                               "XDG_STATE_HOME", "TZ", "GPUMON_CONFIG", "GPUMON_HISTORY_PERIOD"))
    status = tmp_path / "status"
    tmux = tmux_session(120, 40)
    tmux.start(f"env {passed} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --interval {INTERVAL}; "
               f"echo $? > {status}")
    tmux.wait_for(lambda s: "sleep" in s, what="the processes")
    wait_for_rows(db, b)  # no watch: the TUI records

    def held() -> float:
        with sqlite3.connect(db) as conn:
            return conn.execute(f"SELECT sum(held_s) FROM {USER_ROWS}").fetchone()[0]

    since = time.time()
    running = watch(env, "--count", "50")  # both record to one file now: the watch alone counts
    _, err = running.communicate(timeout=60)
    until = time.time()
    assert running.returncode == 0 and err == "", err
    wait_for_rows(db, a)
    time.sleep(2.5 * float(PERIOD))  # the TUI records again, a period at a time
    tmux.keys("q")
    deadline = time.monotonic() + 20
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status.read_text().strip() == "0"
    period = float(PERIOD)
    with sqlite3.connect(db) as conn:
        inside, periods = conn.execute(
            f"SELECT sum(held_s), count(DISTINCT minute) FROM {USER_ROWS} AND minute >= ? AND minute + ? <= ?",
            (since + period, period, until)).fetchone()
        (after,) = conn.execute("SELECT count(*) FROM holder_minutes WHERE minute > ?", (until + period,)).fetchone()
    # Two cards held all along, counted once while both ran: never twice the time.
    assert periods >= 2 and 2 * period * periods * 0.5 <= inside <= 2 * period * (periods + 1)
    assert after > 0  # and the TUI took over again when the watch stopped


def test_report_hosts_merges_each_hosts_own_report_over_ssh(fake_lib, idle_processes, ssh_lab):
    """Hosts a and b of the real-sshd lab each have a ledger their own watch wrote; host down cannot
    be reached: the report merges a's and b's rows under their names and names down's problem."""
    import os

    busy, idle = idle_processes("sleep", "600"), idle_processes("sleep", "600")
    for alias, pid, sm in (("a", busy.pid, 70), ("b", idle.pid, 0)):
        host = ssh_lab.host(alias)
        host.machine.cards = [Card(extra={"power_mw": 100_000})]
        host.machine.procs = [dict(gpu=0, pid=pid, mem=GIB, sm=sm)]
        host.write()
        env = {**os.environ, "GPUMON_NVML_LIB": str(fake_lib), "FAKE_NVML_CONFIG": str(host.driver_config),
               "XDG_STATE_HOME": str(host.state_home), "GPUMON_HISTORY_PERIOD": PERIOD}
        out = subprocess.run([sys.executable, "-m", "gpumon", "watch", "--interval", INTERVAL, "--count", "15"],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stderr == "", out.stderr
    elsewhere = ssh_lab.server()
    ssh_lab.host("down", server=elsewhere)
    elsewhere.kill()

    result = ssh_lab.gpumon("report", "--json", "--hosts", "a,b,down")
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["source"] == "hosts"
    assert [(h["host"], h["state"]) for h in doc["hosts"]] == [("a", "ok"), ("b", "ok"), ("down", "error")]
    assert "down" in result.stderr and "connection refused" in doc["hosts"][2]["error"]
    rows = {r["host"]: r for r in doc["rows"] if r["kind"] == "user"}
    assert set(rows) == {"a", "b"} and rows["a"]["mean_sm"] == 70 and rows["b"]["idle_hours"] > 0
    assert sorted(c["host"] for c in doc["cards"]) == ["a", "b"]
    text = ssh_lab.gpumon("report", "--hosts", "a,b")
    assert text.returncode == 0 and "a: root" in text.stdout and "b:GPU 0" in text.stdout


def test_a_clock_step_and_a_card_reset_add_no_time_and_old_rows_go(fake_driver, idle_processes, tmp_path):
    """In one process: the real sampler over the fake driver, its holders, the minute book and the
    writer thread. The wall clock steps back an hour and a card comes back under another index:
    the seconds counted are the monotonic ones, in the same card's rows; rows past `keep` go."""
    import dataclasses

    from gpumon.cards.backends.nvml import NvmlBackend
    from gpumon.cards.sampler import Sampler
    from gpumon.owners.holders import HolderTracker
    from gpumon.usage.ledger import LedgerWriter
    from gpumon.usage.minutes import HOLDER_FIELDS, MinuteBook

    proc = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card(extra={"power_mw": 100_000})]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=GIB, sm=50)]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        sampler = Sampler(backend)
        clock = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
        book, tracker = MinuteBook(60.0, clock=lambda: next(clock)), HolderTracker()
        done = []
        for step in range(6):
            snapshot = sampler.collect()
            if step >= 3:  # the wall clock goes back an hour; the card is back as GPU 1 (same UUID)
                gpus = tuple(dataclasses.replace(g, index=1) for g in snapshot.gpus)
                snapshot = dataclasses.replace(snapshot, time=snapshot.time - 3600, gpus=gpus)
            done += book.add(snapshot, tracker.update(snapshot))
    finally:
        backend.close()
    minutes = done + [book.take()]
    rows = [(key, row[HOLDER_FIELDS.index("held_s")], row[0]) for m in minutes for key, row in m.holders.items()
            if key[2] == "user"]
    assert sum(held for _, held, _ in rows) == pytest.approx(5.0)  # five gaps of 1 s, whatever the wall clock did
    assert len({key[1] for key, _, _ in rows}) == 1  # one card, by its UUID

    db = tmp_path / "usage.sqlite"
    old = dataclasses.replace(minutes[0], start=int(time.time()) - 100 * 86400)
    writer = LedgerWriter(db, keep_s=400 * 86400)
    writer.submit(old)
    writer.close()
    writer = LedgerWriter(db, keep_s=90 * 86400)  # the next start prunes what is past `keep`
    for minute in minutes:
        writer.submit(minute)
    writer.close()
    with sqlite3.connect(db) as conn:
        starts = {m for (m,) in conn.execute("SELECT DISTINCT minute FROM holder_minutes")}
        held, peak, index = conn.execute(
            "SELECT sum(held_s), max(mem_peak), max(c.card_index) FROM holder_minutes r JOIN cards c ON c.id = r.card "
            "JOIN holders h ON h.id = r.holder WHERE h.kind = 'user'").fetchone()
    assert starts == {m.start for m in minutes} and writer.failing is None
    assert (held, peak, index) == (pytest.approx(5.0), GIB, 1)  # the columns as the book made them


def test_a_damaged_ledger_is_one_line_in_the_tuis_log_and_the_tui_goes_on(fake_driver, tmp_path, idle_processes,
                                                                          tmux_session):
    import shlex

    proc = idle_processes("sleep", "600")
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=GIB, sm=10)]
    fake_driver.write()
    db = tmp_path / "usage.sqlite"
    db.write_bytes(b"this is not a database, " * 400)
    log = tmp_path / "gpumon.log"
    env = {**ledger_env(fake_driver, tmp_path, db), "GPUMON_LOG_FILE": str(log)}
    passed = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()
                      if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME",
                               "XDG_STATE_HOME", "TZ", "GPUMON_CONFIG", "GPUMON_HISTORY_PERIOD", "GPUMON_LOG_FILE"))
    status = tmp_path / "status"
    tmux = tmux_session(120, 40)
    tmux.start(f"env {passed} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --interval {INTERVAL}; "
               f"echo $? > {status}")
    tmux.wait_for(lambda s: "sleep" in s, what="the processes")
    deadline = time.monotonic() + 30
    while "usage history" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(3 * float(PERIOD))  # more minutes fail: still one line
    assert "sleep" in tmux.screen()
    tmux.keys("q")
    deadline = time.monotonic() + 20
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status.read_text().strip() == "0"
    (line,) = [x for x in log.read_text().splitlines() if "usage history" in x]
    assert "not a database" in line
