"""The place every user of a host shares: one folder, one small file per record (records.py).
A claim or a queue entry is a file its process holds an flock(2) on, so it dies with the process
(kill -9 included); whose a record is comes from stat(), never from what it says.

Who may remove a record is decided by the folder: in a sticky folder only a file's owner, root and
the folder's owner can. So the place is one no ordinary user owns: the folder an admin made
(`/run/gpumon`, `/var/lib/gpumon`, or `[claims] dir`), else /tmp/gpumon-claims, which is made by
whoever launches first and then is theirs; check_folder says so, with the command that fixes it.
There is no lock to hold: nothing another user holds or plants here can stop a launch claiming.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DIR = "/tmp/gpumon-claims"
# Folders an admin (or a tmpfiles.d entry) makes; the first that exists, owned by root, is the place.
SYSTEM_DIRS = ("/run/gpumon", "/var/lib/gpumon")
TMPFILES_LINE = "d /run/gpumon 1777 root root -"
ENV = "GPUMON_CLAIMS_DIR"  # tests (and admins trying a folder) point it elsewhere
MAKE_SYSTEM_DIR = "as root: install -d -m 1777 /run/gpumon"


class Unavailable(Exception):
    """The place cannot be used; the text says why, in one line."""


IDLE_RELEASE_S = 30 * 60.0  # a reservation unused this long ends, unless the host's config says otherwise


def where(configured: str | None, environ: Mapping[str, str] = os.environ) -> Path:
    """$GPUMON_CLAIMS_DIR, else `configured` (the config's `[claims] dir`), else the first of
    SYSTEM_DIRS that is a folder root owns, else /tmp/gpumon-claims."""
    named = environ.get(ENV) or configured
    if named:
        return Path(named).expanduser()
    for candidate in SYSTEM_DIRS:
        try:
            st = os.lstat(candidate)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == 0:
            return Path(candidate)
    return Path(DEFAULT_DIR)


@dataclass(frozen=True)
class SharingSettings:
    """`[claims]`: the folder every user of the host shares, and how long a reservation may go unused."""

    directory: Path = field(default_factory=lambda: where(None))
    # The host's limit (the admin's system config, else 30 min). Every reader judges every
    # reservation by it, so whose config is read never decides whether another's booking stands.
    idle_release_s: float = IDLE_RELEASE_S
    # This user's own `[claims] idle_release`: written into the reservations they make, where it
    # may only shorten the host's limit.
    own_idle_release_s: float | None = None

    @property
    def recorded_idle_release(self) -> float | None:
        """What this user's new reservations record for every reader: their own idle release,
        where it is shorter than the host's (never longer)."""
        own = self.own_idle_release_s
        return own if own is not None and own < self.idle_release_s else None


def sharing_settings(directory: str | None, host_idle_release: str | None = None,
                     own_idle_release: str | None = None,
                     environ: Mapping[str, str] = os.environ) -> SharingSettings:
    """The settings from the config's `[claims]` (the host's file's idle_release apart from the
    user's), checked; UsageError names the bad key."""
    own = idle_release_s(own_idle_release) if own_idle_release else None
    return SharingSettings(where(directory, environ), idle_release_s(host_idle_release), own)


@dataclass(frozen=True)
class FolderCheck:
    """Whether a launch may keep its records in a folder (`usable`), in one line (`why`), with what
    fixes it; `shared_badly`: usable by this user, but not as a place every user shares."""

    usable: bool
    why: str
    fix: str = ""
    shared_badly: bool = False


def check_folder(directory: Path) -> FolderCheck:
    """The one judgement of a claims folder, for launches (`ensure`) and `gpumon doctor` alike.
    The folder itself is judged, never where a link points: a link in /tmp is anyone's to make."""
    made, chmod = f"as root: install -d -m 1777 {directory}", f"chmod 1777 {directory}"
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        if os.access(directory.parent, os.W_OK | os.X_OK):
            return FolderCheck(True, f"{directory} does not exist yet; it can be created")
        return FolderCheck(False, f"{directory} does not exist and {directory.parent} is not writable", made)
    except OSError as exc:
        return FolderCheck(False, f"cannot read {directory}: {exc.strerror}", f"check {directory}'s permissions")
    if stat.S_ISLNK(st.st_mode):
        return FolderCheck(False, f"{directory} is a symbolic link, not a folder",
                           f"name the folder itself in [claims] dir, or remove the link; {made}")
    if not stat.S_ISDIR(st.st_mode):
        return FolderCheck(False, f"{directory} is not a folder", f"remove it; {made}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return FolderCheck(False, f"{directory} is writable by others but not sticky (chmod +t): anyone could "
                                  "remove a claim", chmod)
    if not os.access(directory, os.W_OK | os.X_OK):
        return FolderCheck(False, f"{directory} is not writable by {user_name(os.geteuid())}", chmod)
    if not os.access(directory, os.R_OK):  # others' claims could not be seen
        return FolderCheck(False, f"{directory} cannot be listed by {user_name(os.geteuid())}: others' claims "
                                  "cannot be seen", chmod)
    if not st.st_mode & stat.S_ISVTX:
        return FolderCheck(True, f"{directory} is not sticky and only its owner may write there: other users' "
                                 "launches cannot claim", chmod, shared_badly=True)
    if st.st_uid != 0:
        return FolderCheck(True, f"{directory} belongs to {user_name(st.st_uid)}, who can remove anyone's claims "
                                 "and reservations there (the sticky bit does not hold against a folder's owner)",
                           MAKE_SYSTEM_DIR, shared_badly=True)
    return FolderCheck(True, f"{directory} is usable (sticky, writable, root's)")


def ensure(directory: Path) -> Path:
    """The folder, made (sticky, world-writable) if missing; Unavailable if check_folder finds it
    unusable (a folder others may write to must be sticky, or anyone could remove a claim)."""
    try:
        os.mkdir(directory, 0o1777)
        os.chmod(directory, 0o1777)  # the umask took bits away
    except FileExistsError:
        pass
    except OSError as exc:
        raise Unavailable(f"cannot make {directory}: {exc.strerror}") from None
    check = check_folder(directory)
    if not check.usable:
        raise Unavailable(check.why)
    return directory


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def idle_release_s(configured: str | None) -> float:
    """`[claims] idle_release` in seconds (default 30 minutes)."""
    from gpumon.errors import UsageError
    from gpumon.units import parse_duration

    if not configured:
        return IDLE_RELEASE_S
    try:
        return parse_duration(configured)
    except UsageError as exc:
        raise UsageError(f"config [claims] idle_release: {exc}") from None
