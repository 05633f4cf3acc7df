"""The claims folder that claims, the queue and reservations would use with the config in force:
$GPUMON_CLAIMS_DIR, else the config's `[claims] dir`, else /tmp/gpumon-claims (sharing/folder.py)."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

from gpumon.config import Config
from gpumon.doctor.check import FAIL, OK, WARN, Check
from gpumon.sharing.folder import ENV, where


def claims_folder(config: Config) -> Check:
    """The folder checked, and said where it comes from (a folder the admin named is looked for there)."""
    folder = where(config.claims_dir)
    check = _folder_check(folder)
    source = f" (${ENV})" if os.environ.get(ENV) else " ([claims] dir)" if config.claims_dir else ""
    return replace(check, summary=check.summary + source)


def _folder_check(folder: Path) -> Check:
    try:
        mode = folder.stat().st_mode
    except FileNotFoundError:
        parent = folder.parent
        if os.access(parent, os.W_OK | os.X_OK):
            return Check("claims.dir", OK, f"{folder} does not exist yet; it can be created")
        return Check("claims.dir", FAIL, f"{folder} does not exist and {parent} is not writable",
                     f"as root: install -d -m 1777 {folder}")
    except OSError as exc:
        return Check("claims.dir", FAIL, f"cannot read {folder}: {exc.strerror}", f"check {folder}'s permissions")
    if not stat.S_ISDIR(mode):
        return Check("claims.dir", FAIL, f"{folder} is not a folder",
                     f"remove it; as root: install -d -m 1777 {folder}")
    if not mode & stat.S_ISVTX:
        # Without the sticky bit any user could delete another's claim.
        return Check("claims.dir", WARN, f"{folder} is not sticky: any user can remove another's claim",
                     f"chmod 1777 {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        return Check("claims.dir", FAIL, f"{folder} is not writable by this user", f"chmod 1777 {folder}")
    return Check("claims.dir", OK, f"{folder} is usable (sticky, writable)")
