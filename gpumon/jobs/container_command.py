"""A job whose command starts a container: what gpumon adds to it so the container lands on the
job's cards, and what it refuses.

What gpumon adds, the way each engine understands, is jobs/container_pin.py's; it goes right after
the engine's `run` (before the image: what follows the image is the container's own command, whose
`--gpus` is a training script's, not the engine's). This module reads the command as typed: which
engine, its options, where its subcommand is (in a shell line too), and what it asks for itself.

A command that asks the engine for other cards than the job's (`--gpus all`, a count, `device=`
naming other cards, CDI `=all`, NVIDIA_VISIBLE_DEVICES=all) is refused: the job would see cards
nobody gave it. `--as-typed` starts it anyway, with a warning, leaving its request as it is.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

ENGINES = ("docker", "podman", "nerdctl", "apptainer", "singularity", "enroot")
DAEMON_ENGINES = ("docker", "podman", "nerdctl")  # run options of the Docker CLI's shape
CDI_KIND = "nvidia.com/gpu"

# Words before the engine that only change how it is run.
_WRAPPERS = {"env", "exec", "nice", "nohup", "time", "sudo"}
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")

# Global options (before the subcommand) that take a value, per engine family.
_GLOBAL_VALUES = {
    "docker": {"-H", "--host", "-c", "--context", "--config", "-l", "--log-level", "--tlscacert", "--tlscert",
               "--tlskey"},
    "podman": {"--root", "--runroot", "--storage-driver", "--storage-opt", "--cgroup-manager", "--runtime",
               "--runtime-flag", "--events-backend", "--log-level", "--url", "-c", "--connection", "--identity",
               "--network-cmd-path", "--network-config-dir", "--tmpdir", "--hooks-dir", "--conmon", "--volumepath",
               "--imagestore", "--module", "--ssh", "--cni-config-dir", "--config", "--out"},
    "nerdctl": {"-H", "-a", "--address", "--host", "-n", "--namespace", "--snapshotter", "--storage-driver",
                "--cni-path", "--cni-netconfpath", "--data-root", "--cgroup-manager", "--host-gateway-ip",
                "--hosts-dir", "--config"},
    "apptainer": {"-c", "--config"},
    "enroot": set(),
}
# `run` options of Docker, Podman and nerdctl that take no value: any other option is taken to
# take one (written `--opt value`), so an unknown flag may shift where the image is, never hide it.
_RUN_FLAGS = {
    "-d", "--detach", "-i", "--interactive", "-t", "--tty", "--rm", "--privileged", "--init", "--read-only",
    "--read-only-tmpfs", "-P", "--publish-all", "-q", "--quiet", "--replace", "--rmi", "--rootfs", "--env-host",
    "--no-healthcheck", "--no-hosts", "--oom-kill-disable", "--sig-proxy", "--http-proxy", "--help",
    "--disable-content-trust", "--passwd", "--tls-verify", "--unsetenv-all", "--use-os", "--tty=true",
}
_SHORT_FLAGS = set("ditPq")
# Apptainer's options that take a value (its flags are many more; the image follows them).
_APPTAINER_VALUES = {"-B", "--bind", "--mount", "-H", "--home", "-W", "--workdir", "-S", "--scratch", "--env",
                     "--env-file", "--overlay", "-o", "--security", "--network", "--network-args", "--hostname",
                     "--pwd", "--apply-cgroups", "--app", "--fusemount", "--cpus", "--memory", "--cpu-shares",
                     "--dns", "--drop-caps", "--add-caps", "--pid-file", "--uts", "--ipc", "--keep-privs"}
_ENROOT_VALUES = {"-c", "--conf", "-e", "--env", "--rc", "-m", "--mount"}
_SUBCOMMANDS = {"docker": ("run",), "podman": ("run",), "nerdctl": ("run",),
                "apptainer": ("exec", "run", "shell", "test"), "enroot": ("start",)}


class OtherCards(Exception):
    """The command asks its engine for other cards than the job's: the line to say."""


@dataclass(frozen=True)
class ContainerCommand:
    """Where a command starts a container: the engine, the words up to its subcommand (to stop the
    container with the same engine, storage and host: `engine_words + ["stop", ID]`), and the
    subcommand's options as typed."""

    engine: str  # "docker", "podman", "nerdctl", "apptainer", "singularity", "enroot"
    at: int  # the index of the subcommand word ("run", "exec", "start") in the command
    engine_words: tuple[str, ...]
    options: tuple[tuple[str, str | None], ...]  # (option, value) before the image
    detached: bool = False
    remote: bool = False  # a remote engine (podman --remote/--url, docker -H tcp://): its processes are elsewhere

    @property
    def family(self) -> str:
        return "apptainer" if self.engine == "singularity" else self.engine

    def values(self, *names: str) -> list[str]:
        return [value for option, value in self.options if option in names and value is not None]


def find_container(command: Sequence[str]) -> ContainerCommand | None:
    """The container a command starts, as the user typed it; None for any other command."""
    words = list(command)
    i = 0
    while i < len(words) and (_ASSIGNMENT.match(words[i]) or os.path.basename(words[i]) in _WRAPPERS
                              or (i > 0 and os.path.basename(words[i - 1]) in _WRAPPERS
                                  and words[i].startswith("-"))):
        i += 1
    if i >= len(words):
        return None
    engine = os.path.basename(words[i])
    if engine not in ENGINES:
        return None
    family = "apptainer" if engine == "singularity" else engine
    start, i = i, i + 1
    remote = False
    while i < len(words) and words[i].startswith("-"):
        option = words[i].split("=", 1)[0]
        value = words[i].split("=", 1)[1] if "=" in words[i] else None
        if value is None and option in _GLOBAL_VALUES[family] and i + 1 < len(words):
            value = words[i + 1]
            i += 1
        if family == "podman" and option in ("--remote", "-r", "--url", "--connection"):
            remote = True
        elif family in ("docker", "nerdctl") and option in ("-H", "--host"):
            remote = not _local_address(value or "")
        i += 1
    if i < len(words) and words[i] == "container" and family in DAEMON_ENGINES:
        i += 1
    if i >= len(words) or words[i] not in _SUBCOMMANDS[family]:
        return None
    at = i
    options = _options(family, words[at + 1:])
    detached = family in DAEMON_ENGINES and any(
        o in ("-d", "--detach") and v in (None, "true") or (o.startswith("-") and not o.startswith("--")
                                                             and "d" in o[1:] and set(o[1:]) <= _SHORT_FLAGS)
        for o, v in options)
    if family == "podman" and os.environ.get("CONTAINER_HOST"):
        remote = True
    elif family == "docker" and not any(o in ("-H", "--host") for o in words[start:at]):
        remote = not _local_address(os.environ.get("DOCKER_HOST", ""))
    return ContainerCommand(engine, at, tuple(words[start:at]), tuple(options), detached, remote)


def _local_address(address: str) -> bool:
    """Whether an engine's address is on this machine: a unix socket (or none: the default one)."""
    return not address or address.startswith(("unix://", "/"))


def _options(family: str, words: list[str]) -> list[tuple[str, str | None]]:
    """The subcommand's options up to the image: (option, value or None)."""
    values = {"apptainer": _APPTAINER_VALUES, "enroot": _ENROOT_VALUES}.get(family)
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        word = words[i]
        option, eq, value = word.partition("=")
        if eq:
            out.append((option, value))
        elif values is not None:  # apptainer, enroot: only the options listed take a value
            if option in values and i + 1 < len(words):
                out.append((option, words[i + 1]))
                i += 1
            else:
                out.append((option, None))
        elif option in _RUN_FLAGS or (not option.startswith("--") and set(option[1:]) <= _SHORT_FLAGS):
            out.append((option, None))
        elif not option.startswith("--") and len(option) > 2:  # -eVAR=x, -v/a:/b: the value attached
            out.append((option[:2], option[2:]))
        elif i + 1 < len(words):
            out.append((option, words[i + 1]))
            i += 1
        i += 1
    return out


# -- what the command asks for itself --

def _names(value: str) -> list[str]:
    return [v.strip() for v in value.strip().strip("'\"").split(",") if v.strip()]


def asked_cards(container: ContainerCommand) -> tuple[str, list[str] | None] | None:
    """(how the command asks, the cards it names, None for all or a count): its own GPU request, or
    None where it makes none."""
    for value in container.values("--gpus"):
        text = value.strip().strip("'\"")
        devices = None
        for part in _csv(text):
            key, eq, rest = part.partition("=")
            if eq and key.strip() == "device":
                devices = _names(rest)
        if devices is not None and "all" not in devices:
            return f"--gpus {value}", devices
        return f"--gpus {value}", None
    for value in container.values("--device"):
        if value.startswith(CDI_KIND + "="):
            named = _names(value.partition("=")[2])
            return f"--device {value}", None if "all" in named else named
    for value in container.values("-e", "--env"):
        name, eq, wanted = value.partition("=")
        if eq and name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
            named = _names(wanted)
            return f"{name}={wanted}", None if "all" in named else named
    return None


def _csv(text: str) -> list[str]:
    """The parts of a `--gpus` value as Docker reads it (CSV: `"device=0,1",capabilities=compute`)."""
    parts, current, quoted = [], "", False
    for char in text:
        if char == '"':
            quoted = not quoted
        elif char == "," and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def check_cards(container: ContainerCommand, refs: Sequence[str], indices: Sequence[int],
                as_typed: bool = False) -> str | None:
    """Raise OtherCards when the command asks its engine for other cards than `refs` (the job's,
    by UUID; empty while they are not chosen yet); with `as_typed`, the warning to print instead.
    A request naming exactly the job's cards (by UUID or index) is the job's own."""
    asked = asked_cards(container)
    if asked is None:
        return None
    how, named = asked
    mine = set(refs) | {str(i) for i in indices}
    if named is not None and refs and set(named) <= mine:
        return None
    what = "every card" if named is None and ("all" in how) else (
        "cards by count (the engine picks which)" if named is None else f"card(s) {', '.join(named)}")
    cards = ", ".join(f"GPU {i}" for i in indices) or "the cards gpumon will choose"
    line = f"the container asks {container.engine} for {what} ({how}), not the job's {cards}"
    if not as_typed:
        raise OtherCards(f"{line}: remove it (gpumon pins the container itself), or run with --as-typed")
    return f"{line}: started as typed (--as-typed); it may use cards nobody gave it"


# -- where the container is in the job's command --

_SEPARATORS = set("();<>|&\n")


@dataclass(frozen=True)
class Located:
    """A container command inside a job's command: the argv itself, or a line the user's shell
    runs (`sh -c LINE`, the TUI's), where the additions go right after the subcommand's word."""

    container: ContainerCommand
    shell_at: int | None = None  # in a shell line: the offset just after the subcommand's word

    def apply(self, command: Sequence[str], words: Sequence[str]) -> list[str]:
        """The command with `words` added right after the subcommand."""
        if self.shell_at is None:
            at = self.container.at + 1
            return [*command[:at], *words, *command[at:]]
        line = command[-1]
        return [*command[:-1], line[:self.shell_at] + " " + shlex.join(words) + line[self.shell_at:]]


def locate(command: Sequence[str]) -> Located | None:
    """The container the job's command starts, if any: its words, or in a shell line (`sh -c
    LINE`) the first plain command of the line that starts one."""
    found = find_container(command)
    if found is not None:
        return Located(found)
    if len(command) == 3 and os.path.basename(command[0]) in ("sh", "bash", "dash", "zsh") and command[1] == "-c":
        return _in_shell_line(command[2])
    return None


def _in_shell_line(line: str) -> Located | None:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    simple: list[tuple[str, int]] = []
    try:
        while (token := lexer.get_token()) is not None:
            end = lexer.instream.tell()
            if token and set(token) <= _SEPARATORS:
                if (found := _located(simple, line)) is not None:
                    return found
                simple = []
            else:
                simple.append((token, end))
    except ValueError:  # unbalanced quotes: the shell will say so
        return None
    return _located(simple, line)


def _located(simple: list[tuple[str, int]], line: str) -> Located | None:
    container = find_container([word for word, _ in simple])
    if container is None:
        return None
    word, end = simple[container.at]
    at = line.rfind(word, 0, end)
    return Located(container, at + len(word)) if at >= 0 else None
