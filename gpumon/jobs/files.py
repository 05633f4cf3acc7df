"""Where jobs are kept on disk, and how a record is written: the state folder, each job's private
directory, atomic writes (a kill -9 leaves a record old or new, never half-written), and the
environment handed to a supervisor that someone else starts."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import platformdirs

from gpumon.errors import UsageError

ENVIRONMENT_RECORD = "environment.json"
WAITING_RECORD = "waiting.json"  # a queued job's supervisor says there why it waits


def state_dir() -> Path:
    return Path(platformdirs.user_state_dir("gpumon"))


def jobs_dir() -> Path:
    return state_dir() / "jobs"


def unusable_folder(folder: Path, exc: OSError, doing: str) -> UsageError:
    """One line for a state folder gpumon cannot use (unreadable, unwritable, full): which folder,
    what gpumon was doing, and the system's reason, so the user knows what to free or fix."""
    return UsageError(f"cannot {doing} in {folder}: {exc.strerror or exc} (gpumon's state folder: "
                      "free some space there or make it yours to read and write)")


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so readers see the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_environment(directory: Path, env: dict[str, str]) -> None:
    """For a supervisor started by someone else (systemd): the environment the job must get. Private
    (0600) like every record, and removed by the supervisor as soon as it has read it."""
    write_atomic(directory / ENVIRONMENT_RECORD, json.dumps(env))


def take_environment(directory: Path) -> dict[str, str] | None:
    path = directory / ENVIRONMENT_RECORD
    env = read_json(path)
    path.unlink(missing_ok=True)
    return {str(k): str(v) for k, v in env.items()} if env is not None else None
