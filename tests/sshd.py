"""A real OpenSSH server on loopback for the fleet tests, and host aliases that are different machines.

`SshServer` runs `/usr/sbin/sshd -D -e` on 127.0.0.1 as the current user (root here and in CI:
key logins only) with its own host key, authorized key and config; `kill()` ends the listener and
every session it started (by pid), as if the machine went away, and `start()` brings it back on the
same port. `SshLab` writes an ssh_config whose aliases all reach such servers but each carry a
different fake driver and state directories (`SetEnv`, accepted by the server's `AcceptEnv`), so
every alias is a machine of its own; tests pass `--ssh 'ssh -F CONFIG'` (OpenSSH reads ~/.ssh
from the passwd home, not $HOME, so nothing of the user's own setup is used or touched).
Each server's logins as the user running the tests get a home of their own (`SetEnv HOME`,
holding a new user's /etc/skel files): the login shell there never runs that user's own
~/.bashrc, which may do slow or shared things (`pyenv init` rehashes under a lock file that a
session killed mid-login leaves behind, and every later login then waits 60 s for it).

Fixtures: `ssh_lab` (an SshLab whose servers end with the test; skips without sshd, fails in CI).
The remote gpumon is this checkout's (`lab.remote_gpumon`, next to sys.executable).
"""

from __future__ import annotations

import base64
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from ending import kill_and_wait
from fakenvml import FakeMachine

SSHD = "/usr/sbin/sshd"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")  # as conftest says it (which imports this)
ACCEPTED_ENV = "FAKE_NVML_* GPUMON_* XDG_*"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _set_env(env: dict) -> str:
    return "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items())


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpumon-test", "-f", str(path)],
                   check=True, capture_output=True)


class SshServer:
    """One sshd on 127.0.0.1:port. `env`: variables every session gets (sshd_config SetEnv, which
    wins over the client's and over the passwd entry's HOME), e.g. a PATH that has or lacks programs."""

    def __init__(self, root: Path, authorized_key: Path, env: dict[str, str] | None = None) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.home = root / "home"
        if os.path.isdir("/etc/skel"):
            shutil.copytree("/etc/skel", self.home, symlinks=True)
        else:
            self.home.mkdir()
        env = dict(env or {})
        self.port = free_port()
        self.host_key = root / "host_ed25519"
        _keygen(self.host_key)
        self.config = root / "sshd_config"
        self.log = root / "sshd.log"
        lines = [
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {self.host_key}",
            f"PidFile {root / 'sshd.pid'}", f"AuthorizedKeysFile {authorized_key}",
            "PermitRootLogin prohibit-password", "PubkeyAuthentication yes", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "UsePAM no",
            # Test files live under /tmp (world-writable): StrictModes would refuse the key.
            "StrictModes no", f"AcceptEnv {ACCEPTED_ENV}", "MaxSessions 50", "MaxStartups 50",
            "LogLevel VERBOSE", "PrintMotd no", "PrintLastLog no",
        ]
        if env:
            lines.append(_set_env(env))
        # The user running the tests logs in to the lab's home, never to their own; users a test
        # makes (with homes of its own) keep theirs. A Match block's SetEnv replaces the global one.
        lines += [f"Match User {pwd.getpwuid(os.geteuid()).pw_name}", "  " + _set_env({"HOME": self.home, **env})]
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen | None = None

    @property
    def known_hosts_line(self) -> str:
        key = self.host_key.with_suffix(".pub").read_text().split()
        return f"[127.0.0.1]:{self.port} {key[0]} {key[1]}"

    def start(self, timeout: float = 15.0) -> SshServer:
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        log = open(self.log, "ab")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config), "-p", str(self.port)],
                                     stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not listen on port {self.port}: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """The machine goes away: the listener and every session process it started, by pid."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            sessions = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            sessions = []
        self.proc.kill()
        self.proc.wait()
        kill_and_wait(sessions, 5)
        self.proc = None

    def sessions(self) -> list[psutil.Process]:
        """Everything running under this server's sessions now."""
        if self.proc is None:
            return []
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            return []


@dataclass
class LabHost:
    """One alias: its own fake machine and its own gpumon state, like a separate computer."""

    alias: str
    server: SshServer
    root: Path
    machine: FakeMachine = field(default_factory=FakeMachine)
    env: dict[str, str] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)  # ssh_config keywords that replace the lab's

    @property
    def driver_config(self) -> Path:
        return self.root / "fake-nvml.conf"

    @property
    def state_home(self) -> Path:
        return self.root / "state"

    def write(self) -> LabHost:
        self.machine.write(self.driver_config)
        return self


class SshLab:
    def __init__(self, root: Path, fake_lib: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.fake_lib = fake_lib
        self.user_key = root / "id_ed25519"
        _keygen(self.user_key)
        self.authorized = root / "authorized_keys"
        shutil.copy(self.user_key.with_suffix(".pub"), self.authorized)
        self.servers: list[SshServer] = []
        self.hosts: dict[str, LabHost] = {}
        self.ssh_config = root / "ssh_config"
        self.known_hosts = root / "known_hosts"
        self.remote_gpumon = str(Path(sys.executable).with_name("gpumon"))
        # Shared-connection sockets of this test (short path: unix sockets are limited to 108 bytes).
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="gpm-", dir="/tmp"))

    def server(self, env: dict[str, str] | None = None) -> SshServer:
        server = SshServer(self.root / f"sshd{len(self.servers)}", self.authorized, env).start()
        self.servers.append(server)
        self._write_config()
        return server

    def host(self, alias: str, server: SshServer | None = None, env: dict[str, str] | None = None,
             options: dict[str, str] | None = None) -> LabHost:
        server = server or (self.servers[0] if self.servers else self.server())
        host = LabHost(alias, server, self.root / "hosts" / alias, env=dict(env or {}), options=dict(options or {}))
        host.root.mkdir(parents=True, exist_ok=True)
        host.write()
        self.hosts[alias] = host
        self._write_config()
        return host

    def _write_config(self) -> None:
        self.known_hosts.write_text("".join(s.known_hosts_line + "\n" for s in self.servers))
        blocks = []
        for host in self.hosts.values():
            env = {"FAKE_NVML_CONFIG": host.driver_config, "GPUMON_NVML_LIB": self.fake_lib,
                   "XDG_STATE_HOME": host.state_home, "XDG_CONFIG_HOME": host.root / "config",
                   "XDG_DATA_HOME": host.root / "data",
                   # Each alias is a machine of its own: its own place for claims and reservations.
                   "GPUMON_CLAIMS_DIR": host.root / "claims", **host.env}
            options = {
                "HostName": "127.0.0.1", "Port": str(host.server.port), "User": psutil.Process().username(),
                "IdentityFile": str(self.user_key), "IdentitiesOnly": "yes",
                "UserKnownHostsFile": str(self.known_hosts), "GlobalKnownHostsFile": "/dev/null",
                "StrictHostKeyChecking": "yes", "LogLevel": "ERROR",
                "SetEnv": " ".join(f"{k}={v}" for k, v in env.items()), **host.options,
            }
            blocks.append(f"Host {host.alias}\n" + "\n".join(f"  {k} {v}" for k, v in options.items()))
        self.ssh_config.write_text("\n\n".join(blocks) + "\n")

    @property
    def ssh(self) -> str:
        return f"ssh -F {self.ssh_config}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["XDG_RUNTIME_DIR"] = str(self.runtime_dir)
        env.pop("GPUMON_NVML_LIB", None)
        env.pop("FAKE_NVML_CONFIG", None)
        return env

    def gpumon_argv(self, *args: str, remote: str | None = None) -> list[str]:
        """This checkout's gpumon with the lab's ssh and remote gpumon; options go before a `--`."""
        ours = ["--ssh", self.ssh, "--remote-gpumon", remote or self.remote_gpumon]
        if "--" in args:
            cut = args.index("--")
            return [sys.executable, "-m", "gpumon", *args[:cut], *ours, *args[cut:]]
        return [sys.executable, "-m", "gpumon", *args, *ours]

    def gpumon(self, *args: str, timeout: float = 90, remote: str | None = None,
               **kwargs) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.gpumon_argv(*args, remote=remote), env=self.env(), capture_output=True,
                              text=True, timeout=timeout, **kwargs)

    def ssh_run(self, alias: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A plain ssh command to a host (no connection sharing)."""
        return subprocess.run(["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", alias, command],
                              capture_output=True, text=True, timeout=timeout)

    def started_there(self) -> list[psutil.Process]:
        """Processes started through the lab's hosts (jobs, supervisors), known by the state
        directory their session gave them, even after they left the session."""
        marker = f"XDG_STATE_HOME={self.root / 'hosts'}"
        found = []
        for proc in psutil.process_iter():
            try:
                if any(v.startswith(marker) for v in _environ_lines(proc)):
                    found.append(proc)
            except (psutil.Error, OSError):  # gone, or another user's
                continue
        return found

    def close(self) -> None:
        for proc in self.started_there():  # jobs a test left running on its "hosts"
            try:
                proc.kill()
            except psutil.Error:
                pass
        # Shared connections this test opened end with their servers; ask them to go first.
        for sock in self.runtime_dir.glob("gpumon-ssh/*"):
            subprocess.run(["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "lab"], capture_output=True, timeout=10)
        for server in self.servers:
            server.kill()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)


def remote_script(cmdline: list[str]) -> str:
    """The sh script an ssh client's remote command line carries (remote/login.py's base64
    form), or "" for another command line."""
    match = re.search(r"echo ([A-Za-z0-9+/=]+)\|base64 -d", cmdline[-1] if cmdline else "")
    return base64.b64decode(match.group(1)).decode(errors="replace") if match else ""


def _environ_lines(proc: psutil.Process) -> list[str]:
    with open(f"/proc/{proc.pid}/environ", "rb") as f:
        return f.read().decode(errors="replace").split("\0")


def require_sshd() -> None:
    if os.access(SSHD, os.X_OK) and shutil.which("ssh") and shutil.which("ssh-keygen"):
        return
    if IN_CI:
        pytest.fail("openssh-server and openssh-client are required in CI (.ci/run installs them)")
    pytest.skip("openssh-server (/usr/sbin/sshd) and ssh are not installed")


@pytest.fixture
def ssh_lab(tmp_path: Path, fake_lib: Path) -> Iterator[SshLab]:
    require_sshd()
    lab = SshLab(tmp_path / "lab", fake_lib)
    try:
        yield lab
    finally:
        lab.close()
