"""The system OpenSSH client, as gpumon drives it: the only way gpumon reaches another host.

gpumon never speaks SSH itself: the user's own `ssh` (`--ssh CMD`, $GPUMON_SSH, `[fleet] ssh`;
split like a shell would) reads their ~/.ssh/config, agent, certificates, ProxyJump and known_hosts
exactly as their logins do. gpumon only adds what a program needs:

- `BatchMode=yes`, first and so not overridable: ssh never prompts (there is no terminal to ask on).
- A connect timeout and server-alive probes, so a dead host is noticed in seconds, not minutes.
- Connection sharing: `ControlMaster=auto` with a ControlPath in a private 0700 directory and
  `ControlPersist`, so the stream, `run`, `jobs` and signals to one host ride one connection. The
  socket is named after the ssh command and the destination as listed, so two aliases that reach
  the same address (and carry different settings) never share a connection.
Host key checking is left exactly as the user has it: an unknown or changed key is an error.

Remote command lines are POSIX sh scripts handed over in a form every login shell passes on
unchanged, after a mark that says where gpumon's output begins (remote/login.py), so every
argument reaches the remote program byte for byte whatever the login shell is and prints.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import stat
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gpumon.errors import UsageError
from gpumon.remote.children import AsyncChild, spawn_async
from gpumon.remote.hosts import HostSpec
from gpumon.remote.login import marked
from gpumon.sanitize import printable

DEFAULT_SSH = "ssh"
DEFAULT_REMOTE = "gpumon"
CONNECT_TIMEOUT_S = 10
ALIVE_INTERVAL_S = 5
ALIVE_COUNT = 3
PERSIST_S = 60
SSH_FAILED = 255  # ssh's own exit status for its failures
NOT_FOUND = 127  # the remote shell's "command not found"
_MAX_DIR_LEN = 60  # sockets live in DIR/<20 hex> plus ssh's temporary suffix: under the 108-byte limit


def ssh_argv(command: str | None) -> list[str]:
    """The ssh command line: --ssh CMD, else $GPUMON_SSH, else `ssh`; split and `~/` expanded as a
    shell would."""
    text = command or os.environ.get("GPUMON_SSH") or DEFAULT_SSH
    try:
        argv = [os.path.expanduser(w) if w == "~" or w.startswith("~/") else w for w in shlex.split(text)]
    except ValueError as exc:
        raise UsageError(f"bad --ssh {text!r}: {exc}") from None
    if not argv:
        raise UsageError("--ssh is empty: expected e.g. 'ssh' or 'ssh -F ~/.ssh/lab_config'")
    return argv


def _private_dir(path: Path) -> bool:
    """Make `path` a directory only we can use; False when it is someone else's or not a directory."""
    try:
        path.mkdir(mode=0o700, parents=False, exist_ok=True)
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
            return False
        if info.st_mode & 0o077:
            os.chmod(path, 0o700)
        return True
    except OSError:
        return False


def control_dir() -> Path | None:
    """Where shared-connection sockets live: $XDG_RUNTIME_DIR/gpumon-ssh, else /tmp/gpumon-ssh-UID;
    None (no sharing) when neither can be made private."""
    candidates = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        candidates.append(Path(runtime) / "gpumon-ssh")
    candidates.append(Path(tempfile.gettempdir()) / f"gpumon-ssh-{os.getuid()}")
    for path in candidates:
        if len(str(path)) <= _MAX_DIR_LEN and _private_dir(path):
            return path
    return None


def quote_remote(argv: Sequence[str]) -> str:
    """A command line for the remote POSIX shell that gives the program exactly `argv`.
    A leading `~/` in the program's path is left for the remote shell to expand."""
    program, rest = argv[0], list(argv[1:])
    if program.startswith("~/"):
        head = "~/" + shlex.quote(program[2:])
    else:
        head = shlex.quote(program)
    return " ".join([head] + [shlex.quote(arg) for arg in rest])


# (pattern in ssh's stderr, what to tell people), first match wins.
_FAILURES = [
    (r"REMOTE HOST IDENTIFICATION HAS CHANGED|Host key for .* has changed",
     "host key changed (check it, then fix known_hosts)"),
    (r"No \S+ host key is known|Host key verification failed|host key is not known",
     "host key unknown (connect once with ssh to check and accept it)"),
    (r"Permission denied|Too many authentication failures", "auth failed"),
    (r"Could not resolve hostname|Name or service not known|nodename nor servname", "name not resolved"),
    (r"Connection refused", "connection refused"),
    (r"timed out|Timeout, server", "timeout"),
    (r"No route to host|Network is unreachable", "no route to host"),
    (r"Connection reset|Connection closed|closed by remote host|Broken pipe", "connection closed"),
]


# Where a gpumon installed in a venv (not on ssh's PATH) is named: said wherever one is not found.
REMOTE_GPUMON_HINT = "name it with --remote-gpumon PATH or [fleet] remote in the config"


def describe_failure(returncode: int | None, stderr: str) -> str:
    """Why an ssh command failed, in a few words."""
    if returncode == SSH_FAILED or returncode is None:
        for pattern, words in _FAILURES:
            if re.search(pattern, stderr):
                return words
    if returncode == NOT_FOUND:
        return f"gpumon is not installed there (or not on the remote PATH: {REMOTE_GPUMON_HINT})"
    if "unrecognized arguments" in stderr or "invalid choice" in stderr:
        return "gpumon there is too old for this (update it there)"
    lines = [printable(line.strip()) for line in stderr.splitlines() if line.strip()]
    last = lines[-1][:200] if lines else ""
    if returncode == SSH_FAILED:  # no message: a shared connection that went away under us
        return f"ssh failed: {last}" if last else "connection lost"
    return last or f"exited with status {returncode}"


class SshTransport:
    """Builds and runs ssh command lines to hosts; one shared connection per host."""

    def __init__(self, command: str | None = None, remote_gpumon: str | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT_S, sharing: bool = True) -> None:
        self.base = ssh_argv(command)
        if shutil.which(self.base[0]) is None:
            raise UsageError(f"cannot find {self.base[0]!r} to reach other hosts: install OpenSSH's client "
                             "or name yours with --ssh")
        # A program, or a command line of words (`~/venv/bin/python -m gpumon`), split like a shell would.
        text = remote_gpumon or DEFAULT_REMOTE
        try:
            self.remote_gpumon = shlex.split(text)
        except ValueError as exc:
            raise UsageError(f"bad --remote-gpumon {text!r}: {exc}") from None
        if not self.remote_gpumon or self.remote_gpumon[0].startswith("-"):
            raise UsageError(f"bad --remote-gpumon {text!r}: expected a program name or path")
        self.connect_timeout = connect_timeout
        self.control_dir = control_dir() if sharing else None

    def control_path(self, host: HostSpec) -> Path | None:
        if self.control_dir is None:
            return None
        key = "\0".join(self.base + [host.destination, str(host.port)]).encode()
        return self.control_dir / hashlib.sha256(key).hexdigest()[:20]

    def argv(self, host: HostSpec, remote_command: str, tty: bool = False) -> list[str]:
        """ssh … -- DESTINATION REMOTE_COMMAND. The destination was checked (never an option)."""
        argv = [self.base[0], "-o", "BatchMode=yes", *self.base[1:]]
        argv += ["-o", f"ConnectTimeout={self.connect_timeout:g}", "-o", f"ServerAliveInterval={ALIVE_INTERVAL_S}",
                 "-o", f"ServerAliveCountMax={ALIVE_COUNT}"]
        path = self.control_path(host)
        if path is not None:
            argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={path}", "-o", f"ControlPersist={PERSIST_S}"]
        if host.port is not None:
            argv += ["-p", str(host.port)]
        argv += ["-t"] if tty else ["-T"]
        return argv + ["--", host.destination, remote_command]

    def gpumon_script(self, args: Sequence[str]) -> str:
        """The sh script that runs the host's gpumon with exactly `args`."""
        return "exec " + quote_remote([*self.remote_gpumon, *args])

    def gpumon_command(self, args: Sequence[str], mark: bytes | None = None) -> str:
        """The remote command line (for any login shell) that runs the host's gpumon with exactly
        `args`, printing `mark` first."""
        return marked(self.gpumon_script(args), mark)

    def gpumon_argv(self, host: HostSpec, args: Sequence[str], tty: bool = False,
                    mark: bytes | None = None) -> list[str]:
        """ssh to `host` running its gpumon with exactly `args` (after `mark`, when given)."""
        return self.argv(host, self.gpumon_command(args, mark), tty=tty)

    async def spawn(self, host: HostSpec, remote_command: str, limit: int) -> AsyncChild:
        """Start ssh with pipes, tied to gpumon's life (stdin held open: closing it ends the remote
        program; `end()` it when done)."""
        return await spawn_async(self.argv(host, remote_command), limit)
