"""The checks of this machine: the NVIDIA driver, other users' processes, cgroups, the exporter's port
and the Textual version."""

from __future__ import annotations

import os
import re
import socket
from importlib import metadata
from pathlib import Path

from gpumon.cards.backends.nvml.diagnose import diagnose_driver
from gpumon.doctor.check import FAIL, OK, WARN, Check
from gpumon.errors import UsageError

DRIVER_FIX = "install the NVIDIA driver, or name its library with --nvml-lib PATH or $GPUMON_NVML_LIB"


def driver_checks(lib_path: str | None) -> list[Check]:
    explicit = lib_path or os.environ.get("GPUMON_NVML_LIB") or None
    report = diagnose_driver(explicit)
    if report.load_error:
        # Without a library gpumon still shows AMD and Intel cards and --demo: only a named one must load.
        status = FAIL if explicit else WARN
        lost = "" if explicit else " (AMD and Intel cards and --demo still work)"
        return [Check("driver.library", status, report.load_error + lost, DRIVER_FIX),
                Check("nvml.answers", status, "NVML not asked: no library", DRIVER_FIX)]
    version = f", driver {report.driver_version}" if report.driver_version else ""
    nvml = f", NVML {report.nvml_version}" if report.nvml_version else ""
    checks = [Check("driver.library", OK, f"{report.library}{version}{nvml}")]
    if report.init_error:
        checks.append(Check("nvml.answers", FAIL, report.init_error,
                            "check `nvidia-smi`; load the kernel module, or reboot after a driver upgrade"))
    elif report.essential_missing:
        checks.append(Check("nvml.answers", FAIL, "the library lacks " + ", ".join(sorted(report.missing)),
                            "install a driver of this century (R470 or later)"))
    else:
        checks.append(Check("nvml.answers", OK, f"NVML answers: {report.cards} card(s)"))
    if report.missing and not report.essential_missing:
        lost = "; ".join(f"{name}: {what}" for name, what in sorted(report.missing.items()))
        checks.append(Check("nvml.functions", WARN, f"the driver lacks {lost}", "upgrade the NVIDIA driver"))
    elif not report.missing:
        checks.append(Check("nvml.functions", OK, "every function gpumon reads cards with is there"))
    return checks


def _hidepid(procfs: Path) -> bool:
    try:
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[4] == str(procfs) and "hidepid=" in line and "hidepid=0" not in line
               and "hidepid=off" not in line for line in mounts if len(line.split()) > 4)


def other_processes(procfs: Path = Path("/proc")) -> Check:
    """Owners (a process's user, its Slurm job) need other users' /proc entries, environ included."""
    if os.geteuid() == 0:
        return Check("procs.others", OK, "running as root: every process's details are readable")
    if _hidepid(procfs):
        return Check("procs.others", WARN, f"{procfs} is mounted with hidepid: other users' processes on the "
                     "cards show no user, command or owner",
                     "mount /proc without hidepid, or add gpumon's user to its gid= group")
    me = os.getuid()
    for entry in procfs.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == me:
                continue
            (entry / "environ").read_bytes()
        except PermissionError:
            return Check("procs.others", WARN,
                         "other users' process environments are unreadable: their Slurm job ids are not shown "
                         "(user, command and cgroup owners still are)",
                         "run gpumon as root (e.g. the systemd service) or give it CAP_SYS_PTRACE")
        except OSError:
            continue  # gone meanwhile
        return Check("procs.others", OK, "other users' processes and their environments are readable")
    return Check("procs.others", OK, "other users' processes are visible (none runs now to read)")


def cgroup_layout(sysfs: Path = Path("/sys"), procfs: Path = Path("/proc")) -> Check:
    try:
        lines = (procfs / "self" / "cgroup").read_text().splitlines()
    except OSError as exc:
        return Check("cgroup.layout", WARN, f"cannot read {procfs}/self/cgroup: {exc.strerror}",
                     "mount procfs (or give --path.procfs); jobs, pods and containers are not told apart")
    root = sysfs / "fs" / "cgroup"
    if (root / "cgroup.controllers").exists():
        return Check("cgroup.layout", OK, f"cgroup v2 (unified) at {root}")
    if any(line.split(":")[1] for line in lines if line.count(":") >= 2):
        return Check("cgroup.layout", OK, f"cgroup v1 (legacy) at {root}")
    return Check("cgroup.layout", WARN, f"no cgroup hierarchy at {root}",
                 "mount cgroup2 at /sys/fs/cgroup; jobs, pods and containers are not told apart")


def exporter_port(address: str | None) -> Check:
    if not address:
        return Check("exporter.port", OK, "no [watch] prometheus configured")
    from gpumon.exporter.collector import parse_listen_address

    try:
        host, port = parse_listen_address(address)
    except UsageError as exc:
        return Check("exporter.port", FAIL, str(exc), "fix [watch] prometheus in the config")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            # Often a running `gpumon watch --prometheus`: a warning, not a failure.
            return Check("exporter.port", WARN, f"{host}:{port} is taken ({exc.strerror}): `watch --prometheus` "
                         "cannot listen there unless it is the one listening",
                         "stop what listens there (ss -ltnp), or choose another [watch] prometheus")
    return Check("exporter.port", OK, f"{host}:{port} is free for `watch --prometheus`")


_BOUND = re.compile(r"(>=|<=|==|<|>)\s*([0-9][0-9.]*)")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def textual_range() -> Check:
    try:
        wanted = next(r for r in metadata.requires("gpumon") or () if re.match(r"textual\b", r))
        have = metadata.version("textual")
    except (metadata.PackageNotFoundError, StopIteration):
        return Check("textual.version", FAIL, "Textual is not installed", "pip install gpumon again")
    tests = {">=": lambda a, b: a >= b, ">": lambda a, b: a > b, "<": lambda a, b: a < b,
             "<=": lambda a, b: a <= b, "==": lambda a, b: a == b}
    wrong = [f"{op}{v}" for op, v in _BOUND.findall(wanted) if not tests[op](_version(have), _version(v))]
    if wrong:
        return Check("textual.version", WARN, f"Textual {have} is outside the tested range ({wanted})",
                     f"pip install '{wanted.split(';')[0]}'")
    return Check("textual.version", OK, f"Textual {have}, inside the tested range ({wanted[7:].strip()})")
