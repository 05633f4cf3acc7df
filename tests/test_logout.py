"""`gpumon run` says when the job will not survive logout: logind's KillUserProcesses for this user
(logind.conf and its drop-ins), lingering, and whether we are in a login session at all, read from
a machine tree written here (gpumon.jobs.logout.ROOT)."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest
from test_jobs import wait_for
from test_tui import launch_app, run, started  # noqa: F401 - fixtures used by name

from gpumon.cli import main
from gpumon.jobs import logout
from gpumon.jobs import records as jobs

USER = pwd.getpwuid(os.getuid()).pw_name
# This user is excluded by default when it is root: the settings below clear that default.
NOT_EVEN_ROOT = "KillExcludeUsers=\n"


class Machine:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.cgroup(f"0::/user.slice/user-{os.getuid()}.slice/session-4.scope\n")

    def write(self, path: str, text: str) -> None:
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_text(text)

    def conf(self, text: str, path: str = "etc/systemd/logind.conf") -> None:
        self.write(path, "[Login]\n" + text)

    def cgroup(self, text: str) -> None:
        self.write("proc/self/cgroup", text)

    def linger(self) -> None:
        self.write(f"var/lib/systemd/linger/{USER}", "")


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Machine:
    monkeypatch.setattr(logout, "ROOT", tmp_path / "root")
    return Machine(tmp_path / "root")


def test_the_default_keeps_processes(machine):
    assert logout.logout_note(systemd=False) is None
    machine.write("etc/systemd/logind.conf", "[Login]\n#KillUserProcesses=no\n#KillExcludeUsers=root\n")
    assert logout.logout_note(systemd=False) is None


def test_kill_user_processes_says_what_to_do(machine):
    machine.conf("KillUserProcesses=yes\n" + NOT_EVEN_ROOT)
    note = logout.logout_note(systemd=False)
    assert note is not None
    assert "KillUserProcesses=yes in /etc/systemd/logind.conf" in note
    assert "`gpumon run --systemd`" in note and "`loginctl enable-linger`" in note
    machine.linger()  # already lingering: only --systemd is left to do
    note = logout.logout_note(systemd=False)
    assert "--systemd" in note and "enable-linger" not in note


def test_a_distribution_built_to_kill_shows_it_commented_out(machine):
    machine.write("etc/systemd/logind.conf", "[Login]\n#KillUserProcesses=yes\n" + NOT_EVEN_ROOT)
    assert "built-in default" in logout.logout_note(systemd=False)


def test_drop_ins_override_in_file_name_order_and_etc_hides_usr_lib(machine):
    machine.conf("KillUserProcesses=no\n" + NOT_EVEN_ROOT)
    machine.conf("KillUserProcesses=yes\n", "etc/systemd/logind.conf.d/10-kill.conf")
    assert logout.kills_at_logout(USER) == (True, "/etc/systemd/logind.conf.d/10-kill.conf")
    machine.conf("KillUserProcesses=no\n", "usr/lib/systemd/logind.conf.d/20-keep.conf")
    assert logout.kills_at_logout(USER)[0] is False
    machine.conf("KillUserProcesses=yes\n", "etc/systemd/logind.conf.d/20-keep.conf")  # hides /usr/lib's
    assert logout.kills_at_logout(USER) == (True, "/etc/systemd/logind.conf.d/20-keep.conf")
    machine.write("etc/systemd/logind.conf.d/30-other-section.conf", "[Other]\nKillUserProcesses=no\n")
    assert logout.kills_at_logout(USER)[0] is True


def test_only_and_exclude_lists(machine):
    machine.conf("KillUserProcesses=yes\nKillExcludeUsers=\n")
    machine.conf(f"KillExcludeUsers=alice {USER}\n", "etc/systemd/logind.conf.d/exclude.conf")
    assert logout.kills_at_logout(USER)[0] is False
    machine.conf("KillExcludeUsers=\nKillOnlyUsers=alice\n", "etc/systemd/logind.conf.d/exclude.conf")
    assert logout.kills_at_logout(USER)[0] is False
    machine.conf(f"KillExcludeUsers=\nKillOnlyUsers=alice\nKillOnlyUsers={USER}\n",
                 "etc/systemd/logind.conf.d/exclude.conf")
    assert logout.kills_at_logout(USER)[0] is True
    (machine.root / "etc/systemd/logind.conf.d/exclude.conf").unlink()
    machine.conf("KillUserProcesses=yes\n")  # root is excluded unless the list is cleared
    assert logout.kills_at_logout("root")[0] is False
    assert logout.kills_at_logout("root" + "x")[0] is True


def test_outside_a_login_session_logout_ends_nothing(machine):
    machine.conf("KillUserProcesses=yes\n" + NOT_EVEN_ROOT)
    machine.cgroup(f"0::/user.slice/user-{os.getuid()}.slice/user@{os.getuid()}.service/app.slice/x.service\n")
    assert logout.logout_note(systemd=False) is None


def test_a_systemd_job_needs_lingering(machine):
    note = logout.logout_note(systemd=True)
    assert note is not None and "`loginctl enable-linger`" in note
    machine.linger()
    assert logout.logout_note(systemd=True) is None


def test_run_says_it_once_on_stderr(machine, capsys):
    machine.conf("KillUserProcesses=yes\n" + NOT_EVEN_ROOT)
    assert main(["run", "--demo", "--gpu", "0", "--name", "brief", "--", "true"]) == 0
    out, err = capsys.readouterr()
    assert "job " in out and "logind" not in out
    assert err.count("gpumon: note: logind ends your processes at logout") == 1, err
    assert len(_without_busy_note(err)) == 1, err
    wait_for(lambda: all(j.state == "exited" for j in jobs.list_jobs()), what="the job to end")
    machine.conf("KillUserProcesses=no\n" + NOT_EVEN_ROOT)
    assert main(["run", "--demo", "--gpu", "0", "--name", "kept", "--", "true"]) == 0
    assert _without_busy_note(capsys.readouterr().err) == []
    wait_for(lambda: all(j.state == "exited" for j in jobs.list_jobs()), what="the job to end")


def _without_busy_note(err: str) -> list[str]:
    """stderr's lines but the demo card's own note (its GPU 0 is busy: test_input_checks covers that)."""
    return [line for line in err.splitlines() if not (line.startswith("gpumon: GPU 0 is busy:"))]


def test_the_run_dialog_says_it_too(machine, launch_app, tmp_path):  # noqa: F811
    machine.conf("KillUserProcesses=yes\n" + NOT_EVEN_ROOT)
    app, out, notes = launch_app, tmp_path / "out", []

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            app.notify = lambda message, **kw: notes.append(message)  # what the user is told
            await pilot.press("r", *f"echo hi > {out}", "enter")
            for _ in range(200):  # "starting on GPU 0…" comes first, then what the host said
                if any("log:" in note for note in notes):
                    break
                await pilot.pause(0.1)

    run(go())
    said = [note for note in notes if "log:" in note]
    assert said and "logind ends your processes at logout" in said[0], notes
    wait_for(lambda: all(j.state == "exited" for j in jobs.list_jobs()), what="the job to end")
