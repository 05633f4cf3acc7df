"""The place every user of a host shares: a sticky, world-writable folder (as /tmp is), one small
file per record. A claim or a queue entry is a file its process holds an flock(2) on, so it dies
with the process (kill -9 included); whose it is comes from stat(), never from what it says.

Nothing here may hang a launch: every lock is tried for a short time, and a place that is missing,
unwritable or locked too long raises `Unavailable`, whose text is the one line to show.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import re
import stat
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_DIR = "/tmp/gpumon-claims"
ENV = "GPUMON_CLAIMS_DIR"  # tests (and admins trying a folder) point it elsewhere
LOCK_TIMEOUT_S = 2.0
MAX_RECORD = 4096  # bytes of a record read: the files are other users'
MAX_TEXT = 80  # characters of a record's text field kept (a job, a name, a host)
MAX_CARD = 96  # characters of a card's reference, as name_part keeps it
PLACE_LOCK = "place.lock"
_UNSAFE = re.compile(r"[^A-Za-z0-9-]")


class Unavailable(Exception):
    """The place cannot be used; the text says why, in one line."""


IDLE_RELEASE_S = 30 * 60.0  # a reservation unused this long ends, unless the host's config says otherwise


def where(configured: str | None, environ: Mapping[str, str] = os.environ) -> Path:
    """$GPUMON_CLAIMS_DIR, else `configured` (the config's `[claims] dir`), else /tmp/gpumon-claims."""
    return Path(environ.get(ENV) or configured or DEFAULT_DIR).expanduser()


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


def name_part(text: str) -> str:
    """A card's reference or a job id as part of a file name (bus ids have dots and colons)."""
    return _UNSAFE.sub("_", text)[:MAX_CARD] or "_"


def record_name(prefix: str, *parts: str) -> str:
    """`prefix.part…`, each part made safe: what `create` names a record (adding `.random`)."""
    return ".".join([prefix, *map(name_part, parts)])


def name_parts(path: Path) -> list[str]:
    """The parts record_name put in a record's file name, without its prefix and random end."""
    return path.name.split(".")[1:-1]


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
    if not st.st_mode & stat.S_ISVTX:
        return FolderCheck(True, f"{directory} is not sticky and only its owner may write there: other users' "
                                 "launches cannot claim", chmod, shared_badly=True)
    return FolderCheck(True, f"{directory} is usable (sticky, writable)")


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


@contextmanager
def exclusive(directory: Path, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the place's lock: choosing cards and claiming them is one step for everyone."""
    ensure(directory)
    path = directory / PLACE_LOCK
    # Someone else's file, maybe: never followed if a link, never waited on if a FIFO.
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            try:
                fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
                os.fchmod(fd, 0o644)
            except FileExistsError:
                fd = os.open(path, flags)
    except OSError as exc:
        raise Unavailable(f"cannot open {path}: {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Unavailable(f"{path} is not a plain file")
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise Unavailable(f"{path} has been locked by another process for {timeout:g} s") from None
                time.sleep(0.01)
        yield
    finally:
        os.close(fd)


@dataclass
class HeldRecords:
    """Records this process holds (an flock on each, its own open file): they last until
    `release()`, or until every process holding the descriptors has ended."""

    items: list[tuple[int, Path]]

    @property
    def fds(self) -> tuple[int, ...]:
        return tuple(fd for fd, _ in self.items)

    @property
    def paths(self) -> list[Path]:
        return [path for _, path in self.items]

    def close(self) -> None:
        """Let go of our descriptors only: a process they were handed to still holds the records."""
        for fd, _ in self.items:
            os.close(fd)
        self.items = []

    def release(self) -> None:
        for _, path in self.items:
            try:
                path.unlink()
            except OSError:
                pass
        self.close()

    def __bool__(self) -> bool:
        return bool(self.items)


def create(directory: Path, name: str, data: dict[str, Any], locked: bool = True) -> tuple[int, Path]:
    """A new record, written under a hidden name and renamed into place already locked, so no
    reader ever sees it unlocked (and takes it for a stale one)."""
    final = directory / f"{name}.{os.urandom(4).hex()}"
    hidden = directory / f".{final.name}"
    try:
        fd = os.open(hidden, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise Unavailable(f"cannot write in {directory}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o644)
        if locked:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps(data).encode())
        os.rename(hidden, final)
    except OSError as exc:
        os.close(fd)
        hidden.unlink(missing_ok=True)
        raise Unavailable(f"cannot write in {directory}: {exc.strerror}") from None
    return fd, final


@dataclass(frozen=True)
class Record:
    """A live record: whose it is from stat, the rest as its owner wrote it, read through the
    accessors below, each bounded, so that no record reads differently as a claim, a queue entry
    or a reservation."""

    path: Path
    uid: int
    user: str
    changed_ns: int  # st_ctime_ns: set by the kernel when the record was put in place
    data: dict[str, Any]

    def text(self, key: str, limit: int = MAX_TEXT) -> str:
        """A text field ('' when absent or not text; a number as written), cut to `limit`."""
        value = self.data.get(key)
        return str(value)[:limit] if isinstance(value, (str, int, float)) else ""

    def number(self, key: str) -> float | None:
        value = self.data.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def whole(self, key: str) -> int | None:
        value = self.data.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def card(self) -> str | None:
        """The card it is about (UUID, bus id, MIG slice), None when it names none."""
        card = self.data.get("card")
        return card if isinstance(card, str) and 0 < len(card) <= MAX_CARD else None


def records(directory: Path, prefix: str, locked: bool = True) -> list[Record]:
    """The live records named `prefix.*`: held (when `locked`) and readable. Our own stale ones
    are removed on the way (others' cannot be, in a sticky folder: they are skipped)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    found = []
    me = os.geteuid()
    for name in names:
        if not name.startswith(prefix + "."):
            continue
        path = directory / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue
            if locked:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass  # held: alive
                else:  # nobody holds it: its process is gone
                    if st.st_uid == me:
                        path.unlink(missing_ok=True)
                    continue
            data = _json(os.read(fd, MAX_RECORD))
            if data is None:
                continue
            found.append(Record(path, st.st_uid, user_name(st.st_uid), st.st_ctime_ns, data))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EACCES):
                raise
        finally:
            os.close(fd)
    return found


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def inherited(directory: Path, prefix: str) -> list[tuple[int, Path]]:
    """Descriptors this process was handed (pass_fds) on records `prefix.*` in `directory`."""
    held = []
    real = Path(os.path.realpath(directory))
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return []
    for entry in fds:
        try:
            target = Path(os.readlink(f"/proc/self/fd/{entry}"))
        except OSError:
            continue
        if target.parent == real and target.name.startswith(prefix + "."):
            held.append((int(entry), target))
    return held


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
