"""Real logins on the real sshd: users whose login shells are bash, zsh, fish, tcsh and dash, with
rc files that print before gpumon speaks. Every argument must arrive byte for byte, and the
banner must never be read as gpumon's output.

The users are made for this module with useradd (as root; skipped otherwise, failing in CI) and
removed after it, with every process they still run (found by uid, ended by pid).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import IN_CI, Card, add_suite_user, end_users_processes
from sshd import SshLab, require_sshd

from gpumon.remote.children import run_capped
from gpumon.remote.hosts import parse_entry
from gpumon.remote.login import after_mark, new_mark
from gpumon.remote.ssh import SshTransport

# The module's users have fixed names (gpmlogin<shell>, made once for the module): its tests on one
# pytest-xdist worker, or a second worker's useradd of the same names would fail.
pytestmark = pytest.mark.xdist_group("fleet_logins")

# Each shell, the rc file a non-interactive ssh command reads (from its home; XDG_CONFIG_HOME is
# home/config) and what it says.
SHELLS = {
    "bash": (".bashrc", 'echo "(base) conda: environment activated"\n'),
    "zsh": (".zshenv", "echo 'zsh: welcome back'\n"),
    "fish": ("config/fish/config.fish", "echo 'fish: hello from config.fish'\nset -g fish_greeting hi\n"),
    "tcsh": (".tcshrc", "echo 'tcsh: hello'\n"),
    "dash": (".profile", "echo 'dash: hello'\n"),  # (not read by `dash -c`: a quiet login too)
}
HOSTILE = ["back\\slash\\\\n", "!event", "!!", "$HOME", "${HOME}", "$(id)", "`id`", "a'b", 'a"b', "x\ny", "",
           "*", "~", "-c", ";", "&", "|", "ünï €", "\t", "%s", "\\", "^old^new"]
ECHO = "import json, sys; print(json.dumps(sys.argv[1:]))"


def _shell(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if IN_CI:
            pytest.fail(f"{name} is required in CI (.ci/run installs it)")
        pytest.skip(f"{name} is not installed")
    return path


@pytest.fixture(scope="module")
def logins(build_fake) -> Iterator[tuple[SshLab, dict[str, str]]]:
    """A lab whose hosts are the same sshd reached as a user of each shell: {shell: alias}."""
    require_sshd()
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        if IN_CI:
            pytest.fail("the login-shell tests create users: run them as root with useradd")
        pytest.skip("creating users needs root and useradd")
    # Everything the users read lives in a directory they can enter (pytest's are private).
    root = Path(tempfile.mkdtemp(prefix="gpm-logins-", dir="/tmp"))
    root.chmod(0o755)
    lib = root / "libnvidia-ml.so.1"
    shutil.copy(build_fake(), lib)
    lib.chmod(0o755)
    lab = SshLab(root / "lab", lib)
    made: list[str] = []
    aliases: dict[str, str] = {}
    try:
        for shell, (rc, says) in SHELLS.items():
            path = _shell(shell)
            user = f"gpmlogin{shell}"
            home = root / "home" / user
            home.parent.mkdir(exist_ok=True)
            home.parent.chmod(0o755)
            add_suite_user(user, "--no-user-group", "-g", "nogroup", "-M", "-d", str(home), "-s", path)
            made.append(user)
            subprocess.run(["usermod", "-p", "*", user], check=True)  # not locked: sshd lets key logins in
            (home / rc).parent.mkdir(parents=True, exist_ok=True)
            (home / rc).write_text(says)
            subprocess.run(["chown", "-R", f"{user}:nogroup", str(home)], check=True)
            host = lab.host(shell, options={"User": user}, env={
                "XDG_STATE_HOME": home / "state", "XDG_CONFIG_HOME": home / "config", "XDG_DATA_HOME": home / "data"})
            host.machine.cards = [Card("NVIDIA A30")]
            host.write()
            aliases[shell] = shell
        for path in (lab.root, *lab.root.rglob("*")):
            if path.is_dir() or path.name.endswith((".conf", "authorized_keys")):
                path.chmod(path.stat().st_mode | 0o055)
        yield lab, aliases
    finally:
        lab.close()
        if made:
            end_users_processes(*made)
        for user in made:
            subprocess.run(["userdel", user], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("shell", list(SHELLS))
def test_arguments_arrive_byte_for_byte_under_every_login_shell(logins, shell, monkeypatch):
    lab, aliases = logins
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(lab.runtime_dir))
    transport = SshTransport(lab.ssh, f"/usr/bin/python3 -c {json.dumps(ECHO)}")
    mark = new_mark()
    done = run_capped(transport.gpumon_argv(parse_entry(aliases[shell]), HOSTILE, mark=mark), 30, 1 << 20)
    assert done.returncode == 0, done.stderr
    said, _, _ = done.stdout.partition(mark)
    assert after_mark(done.stdout, mark) is not None, done.stdout
    assert json.loads(after_mark(done.stdout, mark)) == HOSTILE
    if shell != "dash":  # the login did talk, and it was skipped
        assert said.strip(), said


def _open_to_all(path: Path) -> bool:
    """Whether every user can reach and run `path` (each directory above it searchable)."""
    path = path.resolve()
    return all(p.stat().st_mode & 0o001 for p in (path, *path.parents))


def _remote_gpumon() -> str:
    """This checkout's gpumon, as another user can run it: the venv's when its interpreter is open
    to all, else the system's Python of the same version with the venv's packages."""
    if _open_to_all(Path(sys.executable)):
        return str(Path(sys.executable).with_name("gpumon"))
    system = Path("/usr/bin/python3")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if system.exists() and subprocess.run([system, "-c", f"import sys; assert sys.version.startswith('{version}.')"],
                                          capture_output=True).returncode == 0:
        site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
        checkout = Path(__file__).resolve().parents[1]
        return f"env PYTHONPATH={checkout}:{site} {system} -m gpumon"
    if IN_CI:
        pytest.fail(f"{sys.executable} is not open to other users and there is no system Python {version}")
    pytest.skip(f"{sys.executable} is not open to other users (its home is private)")


@pytest.mark.parametrize("shell", ["bash", "fish", "tcsh"])
def test_a_talkative_login_does_not_break_the_stream_or_one_shot_commands(logins, shell):
    lab, aliases = logins
    remote = _remote_gpumon()
    result = lab.gpumon("snapshot", "--json", "--hosts", aliases[shell], remote=remote)
    assert result.returncode == 0, result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    assert (host["state"], host["error"]) == ("ok", None), host
    assert [g["name"] for g in host["snapshot"]["gpus"]] == ["NVIDIA A30"]

    started = lab.gpumon("run", "--host", aliases[shell], "--gpu", "0", "--", "/usr/bin/python3", "-c", ECHO,
                         "!event", "back\\slash\\\\n", "$HOME", remote=remote)
    assert started.returncode == 0, started.stderr
    listed = lab.gpumon("jobs", "--hosts", aliases[shell], "--json", remote=remote)
    assert listed.returncode == 0, listed.stderr
    (job,) = json.loads(listed.stdout)
    assert job["command"][-3:] == ["!event", "back\\slash\\\\n", "$HOME"]
