"""The claims folder that claims, the queue and reservations would use with the config in force:
$GPUMON_CLAIMS_DIR, else the config's `[claims] dir`, else /run/gpumon or /var/lib/gpumon where
root made one, else /tmp/gpumon-claims (sharing/folder.py)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

from gpumon.config import Config
from gpumon.doctor.check import FAIL, OK, WARN, Check
from gpumon.sharing.folder import ENV, MAKE_SYSTEM_DIR, TMPFILES_LINE, check_folder, where


def claims_folder(config: Config) -> Check:
    """The folder checked, and said where it comes from (a folder the admin named is looked for there)."""
    folder = where(config.claims_dir)
    check = _folder_check(folder)
    source = f" (${ENV})" if os.environ.get(ENV) else " ([claims] dir)" if config.claims_dir else ""
    return replace(check, summary=check.summary + source)


def _folder_check(folder: Path) -> Check:
    """What a launch would find (sharing/folder.check_folder): what it refuses fails here."""
    found = check_folder(folder)
    status = FAIL if not found.usable else WARN if found.shared_badly else OK
    fix = found.fix
    if fix == MAKE_SYSTEM_DIR:  # and made again at every boot (/run is emptied)
        fix += f"; for every boot, the line '{TMPFILES_LINE}' in /etc/tmpfiles.d/gpumon.conf"
    return Check("claims.dir", status, found.why, fix)
