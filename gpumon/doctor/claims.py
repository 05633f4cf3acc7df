"""The claims folder, checked as `[claims] dir` would name it.

Kept apart from the other checks on purpose: the claims feature lands from another branch, and at
merge this module reads the folder from its config instead of the default below."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpumon.doctor.check import FAIL, OK, WARN, Check

DEFAULT_DIR = Path("/tmp/gpumon-claims")  # sticky and world-writable, like /tmp itself


def claims_folder(folder: Path = DEFAULT_DIR) -> Check:
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
