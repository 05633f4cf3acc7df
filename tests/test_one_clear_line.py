"""What a week of use found on the command line: a state folder gpumon cannot use, bad words in
options and configs, hosts that cannot be read. Each answers with one line naming what is wrong
(exit 2 for the user's side, 4/5 for hosts), never "internal error", and the TUI stays up."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import Card, add_suite_user, end_users_processes, require_tool
from test_claims_users import two_users  # noqa: F401  (the fixture: two real users)
from test_fleet_tui_ssh import type_text


@contextlib.contextmanager
def full_folder() -> Iterator[Path]:
    """A small tmpfs, filled: every write into it fails with ENOSPC, root's included."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    place = Path(tempfile.mkdtemp(prefix="gpumon-full-"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(place)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        (place / "gpumon").mkdir()
        filler = os.open(place / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(filler, b"\0" * 4096)
        os.close(filler)
        yield place
    finally:
        subprocess.run(["umount", str(place)], capture_output=True)
        place.rmdir()


def gpumon(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumon", *args], env=env, capture_output=True, text=True, timeout=60)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if not line.startswith("gpumon: claims:")]
    assert len(lines) == 1, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    return lines[0]


def test_a_full_state_folder_is_one_line_naming_it(tmp_path):
    with full_folder() as state:
        env = dict(os.environ, XDG_STATE_HOME=str(state))
        result = gpumon(env, "--demo", "run", "--gpu", "3", "--", "true")
        assert result.returncode == 2, result.stderr
        line = one_line(result)
        assert str(state / "gpumon") in line and "No space left on device" in line


def test_an_unreadable_or_unwritable_state_folder_is_one_line_naming_it(two_users):  # noqa: F811
    alice, _ = two_users
    folder = alice.home / "state" / "gpumon"
    folder.mkdir(parents=True)
    try:
        folder.chmod(0o555)  # alice cannot write it
        result = alice.gpumon("run", "--gpu", "3", "--", "true")
        assert result.returncode == 2, result.stderr
        line = one_line(result)
        assert str(folder) in line and "Permission denied" in line
        folder.chmod(0o000)  # nor read it
        for args in (("run", "--gpu", "3", "--", "true"), ("jobs",), ("jobs", "--json")):
            result = alice.gpumon(*args)
            assert result.returncode == 2, (args, result.stderr)
            line = one_line(result)
            assert str(folder) in line and "Permission denied" in line, args
    finally:
        folder.chmod(0o755)


def test_the_tui_says_the_state_folder_is_full_and_stays_up(tmux_session, tmp_path):
    status = tmp_path / "status"
    with full_folder() as state:
        tmux = tmux_session(120, 36)
        argv = [sys.executable, "-m", "gpumon", "--demo"]
        tmux.start(f"env XDG_STATE_HOME={shlex.quote(str(state))} TERM=xterm-256color {shlex.join(argv)};"
                   f" echo $? > {status}")
        tmux.wait_for(lambda s: "NVIDIA A100" in s, timeout=30, what="the first frame")
        tmux.keys("r")
        tmux.wait_for(lambda s: "Run on" in s, what="the run dialog")
        type_text(tmux, "true")
        tmux.keys("Enter")
        screen = tmux.wait_for(lambda s: "not launched" in s, timeout=30, what="the refusal")
        assert "No space left" in screen
        assert not status.exists()
        tmux.keys("q")
        tmux.wait_for(lambda s: status.exists(), timeout=20, what="gpumon to quit")
        assert status.read_text().strip() == "0"


def test_a_kernel_log_that_cannot_be_read_is_one_line(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    for path in ("/nonexistent", str(tmp_path)):
        result = fake_driver.run("health", "--kernel-log", path)
        assert result.returncode == 2, result
        assert result.stdout == ""
        line = one_line(result)
        assert line.startswith("gpumon: error: --kernel-log") and path in line, line


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


def test_signal_refuses_system_processes_unless_named_with_their_start(tmp_path):
    """As root. PID 1 is a namespace's own (a shell gpumon runs under), so nothing of this machine's
    is ever signalled, whatever gpumon does."""
    if os.geteuid() != 0:
        pytest.skip("as root, where the OS would allow it")
    require_tool("unshare")
    name = "gpumon53sig"
    add_suite_user(name, "--no-create-home", "--shell", "/bin/sh")
    theirs = subprocess.Popen(["runuser", "-u", name, "--", "setsid", "sleep", "120"])
    mine = subprocess.Popen(["sleep", "120"])
    try:
        leader = session_leader_under(theirs.pid)
        refused = gpumon(dict(os.environ), "signal", str(leader.pid))
        assert refused.returncode == 2, refused
        line = one_line(refused)
        assert f"process {leader.pid}" in line and name in line and "--started" in line, line
        assert leader.is_running()

        kthreadd = psutil.Process(2)
        if kthreadd.name() == "kthreadd":
            refused = gpumon(dict(os.environ), "signal", "2")
            assert refused.returncode == 2 and "kernel thread" in one_line(refused), refused

        code = ("import subprocess, sys; "
                "sys.exit(subprocess.run([sys.executable, '-m', 'gpumon', 'signal', '1']).returncode)")
        inside = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
                                capture_output=True, text=True, timeout=60)
        assert inside.returncode == 2 and "PID 1" in one_line(inside), inside

        assert gpumon(dict(os.environ), "signal", str(mine.pid)).returncode == 0
        assert mine.wait(10) == -15
        named = gpumon(dict(os.environ), "signal", str(leader.pid), "--started", str(leader.create_time()))
        assert named.returncode == 0, named
        leader.wait(10)
    finally:
        for proc in (theirs, mine):
            if _alive(proc):
                proc.kill()
                proc.wait()
        end_users_processes(name)
        subprocess.run(["userdel", name], capture_output=True)


def session_leader_under(pid: int) -> psutil.Process:
    """The `sleep` under runuser `pid`, once it has exec'd in a session of its own."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            for proc in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
                if proc.name() == "sleep" and os.getsid(proc.pid) == proc.pid:
                    return proc
        except (psutil.Error, OSError):
            pass
        time.sleep(0.02)
    raise AssertionError(f"no session leader under {pid}")


@pytest.mark.parametrize(("text", "says"), [
    ('theme = "nosuch"\n', "line 1: unknown theme 'nosuch'; choose from "),
    ('[fleet.groups]\nlab = ["h1", "@lab"]\n', "host group @lab includes itself"),
    ('[fleet.groups]\na = ["@b"]\nb = ["h1, @a"]\n', "includes itself"),
    ('[watch]\non_alert = ""\n', "'watch.on_alert' is empty"),
])
def test_a_bad_config_is_one_line_for_every_command(fake_driver, tmp_path, text, says):
    """`snapshot` reads none of these keys: the docs say every command checks the config all the same."""
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    config = tmp_path / "config.toml"
    config.write_text(text)
    result = fake_driver.run("--config", str(config), "snapshot")
    assert result.returncode == 2, result
    line = one_line(result)
    assert line.startswith(f"gpumon: error: config {config}: ") and says in line, line


def test_an_empty_on_alert_command_is_one_line(fake_driver):
    fake_driver.machine.cards = [Card()]
    fake_driver.write()
    for blank in ("", "  "):
        result = fake_driver.run("watch", "--count", "1", "--on-alert", blank)
        assert result.returncode == 2, result
        assert one_line(result) == "gpumon: error: --on-alert: the command is empty (give a shell command line)"


def test_a_job_whose_end_cannot_be_recorded_yet_shows_as_ended_not_running(tmp_path):
    """The state folder fills while the job runs: its command ends, the supervisor keeps the record
    until the disk has room; meanwhile `jobs` says it ended, not that it runs."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    state = tmp_path / "state"
    state.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(state)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    env = dict(os.environ, XDG_STATE_HOME=str(state))
    go = tmp_path / "go"
    try:
        started = gpumon(env, "--demo", "run", "--gpu", "3", "--", "sh", "-c",
                         f"while [ ! -e {go} ]; do sleep 0.05; done")
        assert started.returncode == 0, started.stderr
        filler = os.open(state / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(filler, b"\0" * 65536)
        os.close(filler)
        go.touch()
        deadline = time.monotonic() + 30
        while True:
            listed = gpumon(env, "jobs")
            if "has ended" in listed.stdout or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        (row,) = [line for line in listed.stdout.splitlines()[1:] if line.strip()]
        assert " ended " in row and " running " not in row, listed.stdout
        assert "record pending" in row, row
        (state / "filler").unlink()  # room again: the supervisor writes its record and leaves
        deadline = time.monotonic() + 30
        while (job := json.loads(gpumon(env, "jobs", "--json").stdout)[0])["state"] != "exited":
            assert time.monotonic() < deadline, job
            time.sleep(0.2)
        assert job["exit_code"] == 0
        supervisor = psutil.Process(job["supervisor_pid"]) if job.get("supervisor_pid") else None
        if supervisor is not None:
            with contextlib.suppress(psutil.Error):
                supervisor.wait(30)
    finally:
        go.touch()
        subprocess.run(["umount", "--lazy", str(state)], capture_output=True)


def test_snapshots_state_is_the_verdict_health_gives(fake_driver):
    remaps = dict(remap_cor=0, remap_unc=0, remap_pending=0, remap_failure=0, mem_temp=70, mem_temp_max=95)
    fake_driver.machine.cards = [Card(extra=dict(remaps, remap_pending=1)), Card(extra=dict(remaps, mem_temp=92)),
                                 Card(extra=dict(remaps))]
    fake_driver.write()
    health = fake_driver.run("health")
    said = {line.split()[1]: line.split()[2] for line in health.stdout.splitlines()}
    assert said == {"0": "FAIL", "1": "WARN", "2": "ok"}, health.stdout
    snapshot = fake_driver.run("snapshot")
    rows = {line.split()[0]: line for line in snapshot.stdout.splitlines() if line.strip()[:1].isdigit()}
    assert [rows[i].split()[rows[i].split().index("A100-SXM4-40GB") + 1] for i in "012"] == ["FAIL", "WARN", "OK"]
    assert "GPU 0: FAIL: remap_pending" in snapshot.stdout


DOCS = Path(__file__).resolve().parent.parent / "docs"


def _npd_check(tmp_path: Path) -> Path:
    """docs/health.md's node-problem-detector script, running this checkout's gpumon."""
    text = (DOCS / "health.md").read_text()
    script = text[text.index("#!/bin/sh\n# /opt/gpumon/npd-check"):]
    script = script[:script.index("```")]
    wrapper = tmp_path / "gpumon"
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} -m gpumon \"$@\"\n")
    wrapper.chmod(0o755)
    path = tmp_path / "npd-check"
    path.write_text(script.replace("/opt/gpumon/.venv/bin/gpumon", str(wrapper)))
    path.chmod(0o755)
    return path


def test_a_driver_library_mismatch_is_documented_and_nonok_for_node_problem_detector(fake_driver, tmp_path):
    text = (DOCS / "health.md").read_text()
    statuses = text[text.index("Exit status: 0 every card ok"):].split("\n\n")[0]
    assert ", 3 " in statuses and "driver" in statuses, statuses
    check = _npd_check(tmp_path)
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.init_error = 18  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
    fake_driver.write()
    assert fake_driver.run("health").returncode == 3
    mismatch = subprocess.run([str(check)], env=fake_driver.env, capture_output=True, text=True, timeout=60)
    assert mismatch.returncode == 1, mismatch  # NonOK: the cards cannot be checked
    assert "driver was upgraded" in mismatch.stdout, mismatch.stdout
    fake_driver.machine.init_error = 0
    fake_driver.write()
    ok = subprocess.run([str(check)], env=fake_driver.env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok


def test_config_show_prints_the_defaults_the_docs_show_in_columns_of_their_own(tmp_path):
    env = dict(os.environ)
    shown = gpumon(env, "config", "--show")
    assert shown.returncode == 0, shown.stderr
    lines = {line.split(" = ")[0]: line for line in shown.stdout.splitlines()[1:]}
    for key, value in (("theme", '"gpumon-dark"'), ("jobs.keep", "200"), ("jobs.keep_for", '"30d"'),
                       ("claims.dir", '"/tmp/gpumon-claims"'), ("claims.idle_release", '"30m"'),
                       ("health.window", '"10m"'), ("health.interval", '"30s"'), ("paths.procfs", '"/proc"'),
                       ("owners.pods_dir", '"/var/log/pods"'), ("history.keep", '"90d"')):
        assert lines[key].split("#")[0].strip() == f"{key} = {value}", lines[key]
        assert lines[key].rstrip().endswith("# default"), lines[key]
    config = tmp_path / "config.toml"
    config.write_text('[fleet]\nprometheus_password_file = "/a/rather/long/path/to/the/prometheus/password"\n')
    shown = gpumon(env, "--config", str(config), "config", "--show")
    columns = {line.index("#") for line in shown.stdout.splitlines()[1:]}
    assert len(columns) == 1, shown.stdout
    for line in shown.stdout.splitlines()[1:]:
        assert line[:line.index("#")].endswith("  "), line  # never a value run into its comment
