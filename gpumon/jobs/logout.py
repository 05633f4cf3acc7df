"""Whether a job outlives the user's logout, and what to do when it would not.

A detached job stays in the login session's scope (its cgroup). systemd-logind ends that scope's
processes at logout when `KillUserProcesses=yes` applies to the user (logind.conf(5): not in
`KillExcludeUsers`, which is "root" unless set; in `KillOnlyUsers` when that lists anyone); the
compiled default is "no" on most distributions, and the shipped logind.conf shows it commented out.
A `--systemd` job runs under the user's service manager instead, which stops, with its units, at
the user's last logout unless lingering is on (`loginctl enable-linger`: /var/lib/systemd/linger/USER).

Everything is read below ROOT: the machine's "/" (tests set a tree of their own).
"""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path

ROOT = Path("/")
CONF = "etc/systemd/logind.conf"
# Where logind reads its configuration, highest priority first: the first main file found, and
# every drop-in by file name (a name in an earlier folder hides the same name in a later one).
MAIN_FILES = (CONF, "run/systemd/logind.conf", "usr/local/lib/systemd/logind.conf", "usr/lib/systemd/logind.conf")
DROP_IN_DIRS = tuple(f"{d}/systemd/logind.conf.d" for d in ("etc", "run", "usr/local/lib", "usr/lib"))
LINGER_DIR = "var/lib/systemd/linger"
_SESSION_SCOPE = re.compile(r"/session-[^/]+\.scope(/|$)", re.M)
_TRUE, _FALSE = {"1", "yes", "y", "true", "t", "on"}, {"0", "no", "n", "false", "f", "off"}


def _assignments(path: Path) -> list[tuple[str, str]]:
    """`Key=value` lines of the [Login] section, in order."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    section, found = None, []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Login" and "=" in line and not line.startswith(("#", ";")):
            key, value = line.split("=", 1)
            found.append((key.strip(), value.strip()))
    return found


def _compiled_default(main: Path | None) -> bool:
    """The shipped logind.conf lists the built-in values commented out: `#KillUserProcesses=no`."""
    if main is not None:
        try:
            said = re.search(r"^#\s*KillUserProcesses\s*=\s*(\S+)", main.read_text(errors="replace"), re.M)
        except OSError:
            said = None
        if said and said.group(1).lower() in _TRUE:
            return True
    return False


def kills_at_logout(user: str) -> tuple[bool, str]:
    """Whether logind ends `user`'s session processes at logout, and the file that says so."""
    main = next((ROOT / f for f in MAIN_FILES if (ROOT / f).is_file()), None)
    drop_ins: dict[str, Path] = {}
    for folder in reversed(DROP_IN_DIRS):  # a name in a higher-priority folder replaces the same name
        try:
            drop_ins |= {p.name: p for p in (ROOT / folder).glob("*.conf") if p.is_file()}
        except OSError:
            pass
    kill, source = _compiled_default(main), "logind's built-in default"
    only: list[str] = []
    exclude = ["root"]
    for path in ([main] if main else []) + [drop_ins[name] for name in sorted(drop_ins)]:
        for key, value in _assignments(path):
            if key == "KillUserProcesses" and value.lower() in _TRUE | _FALSE:
                kill, source = value.lower() in _TRUE, "/" + str(path.relative_to(ROOT))
            elif key in ("KillOnlyUsers", "KillExcludeUsers"):  # a list: empty resets, otherwise adds
                names = only if key == "KillOnlyUsers" else exclude
                names[:] = names + value.split() if value else []
    applies = kill and user not in exclude and (not only or user in only)
    return applies, source


def lingering(user: str) -> bool:
    return (ROOT / LINGER_DIR / user).exists()


def in_login_session() -> bool:
    """Whether this process is in a login session's scope (what logind ends at logout)."""
    try:
        return bool(_SESSION_SCOPE.search((ROOT / "proc/self/cgroup").read_text()))
    except OSError:
        return False


def logout_note(systemd: bool) -> str | None:
    """What to do, in one sentence, when a detached job launched now would end at logout; else None."""
    try:
        user = pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a name (a container): logind would not know it either
        return None
    lingers = lingering(user)
    if systemd:
        return None if lingers else ("the job ends at your last logout: without lingering, systemd stops your "
                                     "user manager and its units; `loginctl enable-linger` once keeps them")
    if not in_login_session():
        return None  # not in a login session's scope: logout ends nothing of ours
    kills, source = kills_at_logout(user)
    if not kills:
        return None
    todo = "`gpumon run --systemd`" + ("" if lingers else ", after `loginctl enable-linger` once")
    return (f"logind ends your processes at logout (KillUserProcesses=yes in {source}), this job too; "
            f"to keep it, launch it with {todo}")
