"""The XIDs that came before a one-shot check (`gpumon health`) started: what a running `watch`
saw, else the kernel log's `NVRM: Xid` lines.

`watch` keeps the XIDs it hears in a state file (`XidStateWriter`): JSON, written atomically (a
temporary file renamed over it) by a thread of its own, never on the sampling path, mode 0600 (the
user running it, and root); it names watch's pid and start time, so a check knows whether that
watch still runs. Without one, the check reads the kernel's log: `/dev/kmsg` (records as the
kernel's Documentation/ABI/testing/dev-kmsg gives them: `PRI,SEQ,USEC,FLAGS;MESSAGE`, USEC since
boot), or, where the kernel refuses it (`dmesg_restrict`), the journal (`journalctl -k`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import platformdirs
import psutil

log = logging.getLogger(__name__)
KEEP_S = 86400.0  # the state file holds a day of XIDs at most
MAX_KEPT = 512
MAX_LOG_BYTES = 8 << 20  # of a kernel log file or journal read
# "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus."
_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)(?:\.\d+)?\): (\d+)")


@dataclass(frozen=True)
class SeenXid:
    code: int
    when: float  # unix time
    uuid: str | None = None  # the card, by UUID (watch's) or PCI bus (the kernel's)
    pci: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class Seen:
    source: str  # "watch" | "kmsg" | "journal" | "none"
    detail: str  # where from, or why nothing could be read
    xids: tuple[SeenXid, ...] = ()
    since: float = 0.0  # unix time from which the source heard everything (a watch: its start)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "detail": self.detail, "xids": len(self.xids)}


def default_state_file() -> Path:
    return Path(platformdirs.user_state_dir("gpumon")) / f"xids.{socket.gethostname()}.json"


def pci_key(bus_id: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of an NVML bus id "00000000:3B:00.0" or the kernel's "0000:3b:00"."""
    if not bus_id:
        return None
    parts = bus_id.split(":")
    try:
        return int(parts[-3], 16), int(parts[-2], 16), int(parts[-1].split(".")[0], 16)
    except (IndexError, ValueError):
        return None


# -- watch's side --

class XidStateWriter:
    """Keeps the state file of the XIDs a `watch` heard; `note` returns at once (the event loop's)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        me = psutil.Process()
        self._head = {"schema": 1, "host": socket.gethostname(), "pid": me.pid, "started": me.create_time()}
        self._xids: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._dirty = threading.Event()
        self._stop = False
        self._dirty.set()  # the file says at once that a watch runs
        threading.Thread(target=self._run, name="gpumon-xid-state", daemon=True).start()

    def note(self, index: int, uuid: str | None, pci_bus_id: str | None, code: int, when: float) -> None:
        with self._lock:
            self._xids = [x for x in self._xids if when - x["time"] < KEEP_S][-(MAX_KEPT - 1):]
            self._xids.append({"index": index, "uuid": uuid, "pci_bus_id": pci_bus_id, "code": code, "time": when})
        self._dirty.set()

    def close(self) -> None:
        self._stop = True
        self._dirty.set()

    def _run(self) -> None:
        while True:
            self._dirty.wait()
            self._dirty.clear()
            if self._stop:
                return
            with self._lock:
                doc = {**self._head, "updated": time.time(), "xids": list(self._xids)}
            try:
                write_private(self.path, json.dumps(doc))
            except OSError as exc:  # a check then reads the kernel log instead
                log.warning("cannot keep the XID state %s: %s", self.path, exc)


def write_private(path: Path, text: str) -> None:
    """Atomically, readable by its owner (and root) only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


# -- the check's side --

def read_watch_state(path: Path) -> Seen | None:
    """The XIDs a watch that still runs has heard; None when no watch runs (or its file is unusable)."""
    try:
        doc = json.loads(path.read_text())
        pid, started = int(doc["pid"]), float(doc["started"])
        if doc.get("host") not in (None, socket.gethostname()):  # a home shared over NFS
            return None
        if abs(psutil.Process(pid).create_time() - started) > 1.0:
            return None  # the pid was reused: that watch has ended
        xids = tuple(SeenXid(int(x["code"]), float(x["time"]), x.get("uuid") or None, pci_key(x.get("pci_bus_id")))
                     for x in doc.get("xids", []) if isinstance(x, dict))
    except FileNotFoundError:
        return None
    except psutil.Error:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.info("XID state %s unusable (%s)", path, exc)
        return None
    return Seen("watch", f"gpumon watch (pid {pid})", xids, started)


def read_kernel_log(path: str, since: float) -> Seen:
    """`NVRM: Xid` lines since `since` (unix time): from `path` (a /dev/kmsg device, or a file of its
    records), else from the journal when the kernel refuses /dev/kmsg."""
    try:
        records = _kmsg_records(path)
    except OSError as exc:
        if path == "/dev/kmsg" and shutil.which("journalctl"):
            return _journal(since, f"{path}: {exc.strerror or exc}")
        return Seen("none", f"cannot read the kernel log {path}: {exc.strerror or exc}")
    booted = time.time() - time.monotonic()  # the records' clock counts from boot, without suspend
    xids = []
    for usec, message in records:
        when = booted + usec / 1e6
        if when >= since and (found := _xid(message, when)) is not None:
            xids.append(found)
    return Seen("kmsg", path, tuple(xids))


def _xid(message: str, when: float) -> SeenXid | None:
    match = _XID_LINE.search(message)
    if match is None:
        return None
    domain, bus, device, code = match.groups()
    return SeenXid(int(code), when, None, (int(domain, 16), int(bus, 16), int(device, 16)))


def _kmsg_records(path: str) -> Iterable[tuple[int, str]]:
    """(µs since boot, message) of each record; continuation lines (" KEY=VALUE") are skipped."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    chunks: list[bytes] = []
    try:
        if stat.S_ISCHR(os.fstat(fd).st_mode):  # /dev/kmsg: one record a read, EAGAIN at the end
            size = 0
            while size < MAX_LOG_BYTES:
                try:
                    chunk = os.read(fd, 8192)
                except BlockingIOError:
                    break
                except BrokenPipeError:  # records overwritten while reading: go on with the next
                    continue
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        else:
            chunks.append(os.read(fd, MAX_LOG_BYTES))
    finally:
        os.close(fd)
    out = []
    for line in b"".join(chunks).decode(errors="replace").splitlines():
        head, sep, message = line.partition(";")
        fields = head.split(",")
        if sep and len(fields) >= 3 and fields[2].isdigit():
            out.append((int(fields[2]), message))
    return out


def _journal(since: float, why: str) -> Seen:
    command = ["journalctl", "-k", "-q", "--no-pager", "-o", "json", f"--since=@{int(since)}"]
    try:
        done = subprocess.run(command, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Seen("none", f"{why}; journalctl: {exc}")
    if done.returncode not in (0, 1):  # 1: nothing matched
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return Seen("none", f"{why}; journalctl: {said[-1] if said else f'status {done.returncode}'}")
    xids = []
    for line in done.stdout[:MAX_LOG_BYTES].decode(errors="replace").splitlines():
        try:
            entry = json.loads(line)
            message, usec = entry.get("MESSAGE"), int(entry["__REALTIME_TIMESTAMP"])
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(message, list):  # the journal gives binary messages as bytes
            message = bytes(b & 0xFF for b in message if isinstance(b, int)).decode(errors="replace")
        if isinstance(message, str) and (found := _xid(message, usec / 1e6)) is not None:
            xids.append(found)
    return Seen("journal", "journalctl -k", tuple(xids))
