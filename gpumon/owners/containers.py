"""Which container a process runs in, and whether gpumon itself runs in one (then the driver lists
pids from other PID namespaces that this process cannot see)."""

from __future__ import annotations

import re
from pathlib import Path

_CONTAINER_PATTERNS = [
    (re.compile(r"kubepods.*?pod([0-9a-f_-]{36})"), "k8s pod {}"),
    (re.compile(r"libpod-(?:conmon-)?([0-9a-f]{12})[0-9a-f]*"), "podman {}"),
    (re.compile(r"docker[-/]([0-9a-f]{12})[0-9a-f]*"), "docker {}"),
    (re.compile(r"containerd.*?([0-9a-f]{12})[0-9a-f]{52}"), "containerd {}"),
]


def container_of(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """'docker 3f2a…', 'podman …', 'k8s pod …' from /proc/PID/cgroup; None for a host process."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(errors="replace")
    except OSError:
        return None
    for pattern, label in _CONTAINER_PATTERNS:
        match = pattern.search(text)
        if match:
            return label.format(match.group(1).replace("_", "-"))
    return None


def status_fields(pid: int, key: str, proc_root: Path = Path("/proc")) -> list[str] | None:
    """The fields of one line of /proc/PID/status (`NSpid:`, `Uid:`), without its key; None when
    the process or the line is not there."""
    try:
        text = (proc_root / str(pid) / "status").read_text(errors="replace")
    except OSError:
        return None
    prefix = key + ":"
    return next((line.split()[1:] for line in text.splitlines() if line.startswith(prefix)), None)


def container_pid(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The process's pid inside its own PID namespace (the last of /proc/PID/status's `NSpid:`
    fields), where that is another namespace than the reader's; else None."""
    fields = status_fields(pid, "NSpid", proc_root) or []
    return int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else None


def running_in_container() -> bool:
    """True when gpumon itself runs in a container, so other pid namespaces hide GPU processes."""
    if Path("/.dockerenv").exists() or Path("/run/.containerenv").exists():
        return True
    return container_of(1) is not None


def invisible_reason() -> str:
    """What to show for a pid the driver lists but this process cannot see."""
    if running_in_container():
        return "not visible: gpumon runs in a container (other PID namespace)"
    return "not visible: exited, or in another PID namespace"
