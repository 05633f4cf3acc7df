"""The settings of one gpumon process, as one frozen value.

The command line builds it once (cli/common.load_settings) from the config files, the environment
and the options, and hands each part to what needs it: `health` to the backends and trackers that
draw the cards' verdicts, `host_paths` to the sampler's reader of who owns a process, `sharing` to
claims, the queue and reservations, `jobs_keep` to job launches. No module keeps configuration of
its own: code called without settings (library use, tests) builds `Settings()`, the defaults.

Each part's type lives with the concern that reads it (HealthSettings beside the health rules it
holds); this module only puts them together, so it sits above them, under the views.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.config import Config
from gpumon.errors import UsageError
from gpumon.health.rules import HealthSettings, configured_settings
from gpumon.jobs.records import JobsKeep
from gpumon.owners.reader import HostPaths
from gpumon.sharing.folder import SharingSettings, sharing_settings


@dataclass(frozen=True)
class Settings:
    # The files as read: what a command reads of them itself (its rules, hosts, interval, theme).
    config: Config = field(default_factory=Config)
    health: HealthSettings = HealthSettings()
    host_paths: HostPaths = HostPaths()
    sharing: SharingSettings = field(default_factory=SharingSettings)
    jobs_keep: JobsKeep = JobsKeep()


def settings_from(config: Config, procfs: str | None = None,
                  environ: Mapping[str, str] = os.environ) -> Settings:
    """The settings of `config` (already read), `procfs` (--path.procfs or [paths] procfs) and
    `environ` ($GPUMON_CLAIMS_DIR); UsageError names what is wrong."""
    health = configured_settings(config)
    sharing = sharing_settings(config.claims_dir, config.claims_idle_release_host, config.claims_idle_release,
                               environ)
    return Settings(config, health, host_paths_of(config, procfs), sharing,
                    JobsKeep(config.jobs_keep, config.jobs_keep_for))


def host_paths_of(config: Config, procfs: str | None) -> HostPaths:
    """Where this host's /proc and its records of who runs what are (--path.procfs or [paths] procfs, [owners])."""
    given = {key: Path(value).expanduser() for key, value in config.owners.items()}
    if procfs:
        given["procfs"] = Path(procfs).expanduser()
        if not given["procfs"].is_dir():
            raise UsageError(f"--path.procfs (or [paths] procfs) {str(given['procfs'])!r} is not a directory")
    return HostPaths(**given)
