"""Which cards this node's Slurm has given to which jobs (their GPU GRES), whether or not the jobs'
processes have opened them yet: asked of `scontrol -d -o show job`, the jobs running here with
their per-node `GRES=gpu:2(IDX:0-1)` (or `gpu:a100:2(IDX:0,2-3)`, or older Slurm's
`GRES_IDX=gpu(IDX:0-1)`). The device cgroup cannot say it: it need not constrain anything.

IDX is a position in the node's GPU list, not an NVML index: gres.conf's `File=` devices for this
node, in their order (`/dev/nvidiaK`: minor number K, NVML's `minor_number`); where gres.conf names
none (`AutoDetect=nvml`), Slurm lists the GPUs by minor number, and so does this.

Asked only where `scontrol` is installed and this host is a Slurm node (slurm.conf at `SLURM_CONF`
or /etc/slurm/), in a thread of its own with a timeout, so a busy slurmctld never delays a sample;
an answer is used for FRESH_S and asked again after it, and one that cannot be renewed is dropped
after KEEP_S. Where Slurm cannot be asked the answer is None, and nothing is said.

Everything scontrol says is text from elsewhere: names and users cut short and made printable.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpumon.model import GpuSample, ProcessOwner, Snapshot
from gpumon.sanitize import printable

# States in which Slurm still counts a job's GRES as allocated: running, its prolog or node boot
# under way (CONFIGURING), suspended (its memory stays on the card and it may resume at any
# moment), its epilog still running (COMPLETING). Slurm gives these cards to nobody else either.
HOLDING_STATES = frozenset({"RUNNING", "CONFIGURING", "SUSPENDED", "COMPLETING"})
CONF_PLACES = (Path("/etc/slurm/slurm.conf"), Path("/etc/slurm-llnl/slurm.conf"))
MAX_OUTPUT = 32 << 20  # scontrol's answer is cut here (tens of thousands of jobs)
MAX_EXPANDED = 4096  # a host list or device range longer than this is not read
_MAX_NAME = 253

_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")
_GPU_ENTRY = re.compile(r"(?:^|(?<=[,\s]))gpu(?::[^(),\s]*)*\(IDX:([^)]*)\)")
_BRACKET = re.compile(r"\[([^\]]*)\]")


@dataclass(frozen=True, slots=True)
class GresJob:
    """A job holding GPUs on this node: its owner as the views show it, and its GRES positions."""

    owner: ProcessOwner  # kind "slurm": id JOBID (an array task ARRAYJOB_TASK), its name, its user
    indices: tuple[int, ...]


def expand_numbers(text: str) -> list[int]:
    """'0,2-3' -> [0, 2, 3]; [] for anything else ('N/A', junk, too many)."""
    out: list[int] = []
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        if not (low.isascii() and low.isdigit()) or (dash and not (high.isascii() and high.isdigit())):
            return []
        first, last = int(low), int(high) if dash else int(low)
        if last < first or len(out) + last - first >= MAX_EXPANDED:
            return []
        out += range(first, last + 1)
    return out


def expand_list(text: str) -> list[str]:
    """A Slurm host list or device list, 'n[01-03,7],gpu9' or '/dev/nvidia[0-3]', one bracket per
    name at most (what node and device names use); zero padding kept."""
    names: list[str] = []
    for item in re.split(r",(?![^\[]*\])", text.strip()):
        match = _BRACKET.search(item)
        if match is None:
            if item:
                names.append(item)
            continue
        head, tail = item[:match.start()], item[match.end():]
        for part in match.group(1).split(","):
            low, _, high = part.partition("-")
            numbers = expand_numbers(part)
            width = len(low.strip()) if low.strip().startswith("0") else 0  # n[01-03]: n01, n02, n03
            names += [f"{head}{n:0{width}d}{tail}" for n in numbers]
        if len(names) > MAX_EXPANDED:
            return []
    return names


def _fields(line: str) -> list[tuple[str, str]]:
    """key=value pairs of one `scontrol -o` line, in order (a key may come again: Nodes=, GRES=);
    a value runs to the next key, so a job name with spaces is whole."""
    keys = list(_KEY.finditer(line))
    return [(m.group(1), line[m.end():keys[i + 1].start() if i + 1 < len(keys) else len(line)].strip())
            for i, m in enumerate(keys)]


def _user(text: str) -> str | None:
    """'alice(1001)' -> 'alice'; '(null)(1001)' -> '1001'."""
    name, _, uid = text.partition("(")
    if name and name != "(null)":
        return printable(name[:64])
    uid = uid.rstrip(")").rpartition("(")[2]
    return uid if uid.isdigit() else None


def parse_jobs(text: str, node: str) -> list[GresJob]:
    """The jobs `scontrol -d -o show job` lists that hold GPUs on `node`, in a state that holds
    them (HOLDING_STATES)."""
    jobs = []
    for line in text.splitlines():
        fields = _fields(line)
        first: dict[str, str] = {}
        for key, value in fields:
            first.setdefault(key, value)
        if first.get("JobState", "").partition(" ")[0] not in HOLDING_STATES:
            continue
        raw = first.get("JobId", "")
        if not raw.isdigit():
            continue
        indices: list[int] = []
        for i, (key, value) in enumerate(fields):
            # A node's detail line: Nodes=… CPU_IDs=… Mem=… GRES=…; anywhere else a "Nodes=" is
            # some other field's text (a job name).
            if key != "Nodes" or i + 1 >= len(fields) or fields[i + 1][0] != "CPU_IDs":
                continue
            if node not in expand_list(value):
                continue
            for detail, gres in fields[i + 1:i + 5]:
                if detail in ("GRES", "GRES_IDX"):
                    for entry in _GPU_ENTRY.finditer(gres):
                        indices += [n for n in expand_numbers(entry.group(1)) if n not in indices]
                if detail == "Nodes":
                    break
        if not indices:
            continue
        array, task = first.get("ArrayJobId", ""), first.get("ArrayTaskId", "")
        job = f"{array}_{task}" if array.isdigit() and task.isdigit() else raw
        name = printable(first["JobName"][:_MAX_NAME]) if first.get("JobName") else None
        jobs.append(GresJob(ProcessOwner("slurm", job, name, _user(first.get("UserId", ""))), tuple(sorted(indices))))
    return jobs


def device_minor(path: str) -> int | None:
    """A device file's minor number: from the device itself, else the digits its name ends with."""
    try:
        info = os.stat(path)
        if stat.S_ISCHR(info.st_mode):
            return os.minor(info.st_rdev)
    except OSError:
        pass
    digits = re.search(r"(\d+)$", path)
    return int(digits.group(1)) if digits else None


def gres_minors(text: str, node: str) -> list[int] | None:
    """The minor numbers of this node's GPUs in Slurm's order, from gres.conf's `Name=gpu File=`
    lines (NodeName= absent or naming this node); None where it names none (AutoDetect)."""
    minors: list[int] = []
    for line in text.splitlines():
        words = dict(word.partition("=")[::2] for word in line.partition("#")[0].split() if "=" in word)
        words = {key.lower(): value for key, value in words.items()}
        if words.get("name") != "gpu" or "file" not in words:
            continue
        if "nodename" in words and node not in expand_list(words["nodename"]):
            continue
        for path in expand_list(words["file"]):
            minor = device_minor(path)
            if minor is None:
                return None  # a device that cannot be placed: the order after it would be a guess
            minors.append(minor)
    return minors or None


def slurm_conf(env: Mapping[str, str] = os.environ) -> Path | None:
    """This node's slurm.conf, where Slurm's own tools find it; None: this host is no Slurm node."""
    given = env.get("SLURM_CONF")
    for path in ([Path(given)] if given else []) + list(CONF_PLACES):
        if path.is_file():
            return path
    return None


class SlurmGres:
    """The jobs holding this node's GPUs, kept fresh in the background (see the module's notes)."""

    # Slurm's own MessageTimeout (10 s by default) is how long scontrol waits for slurmctld.
    TIMEOUT_S = 10.0
    FRESH_S = 5.0  # an answer older than this is asked again (used meanwhile)
    KEEP_S = 60.0  # an answer not renewed for this long is dropped: the jobs may have ended

    def __init__(self, scontrol: str | None = None, conf: Path | None = None, node: str | None = None) -> None:
        self.conf = conf if conf is not None else slurm_conf()
        self.scontrol = scontrol if scontrol is not None else shutil.which("scontrol")
        self.node = node or socket.gethostname().split(".")[0]
        self._answer: tuple[float, list[GresJob], list[int] | None] | None = None
        self._asking = False
        self._asked_at = float("-inf")  # monotonic: a failing scontrol is not run again every sample
        self._tried = threading.Event()  # set once a first question has an answer, or has failed
        self._lock = threading.Lock()

    @property
    def usable(self) -> bool:
        return bool(self.conf and self.scontrol)

    def jobs(self, wait_s: float = 0.0) -> tuple[list[GresJob], list[int] | None] | None:
        """(jobs holding GPUs here, gres.conf's minor numbers or None), or None: Slurm cannot be
        asked, or has not answered yet (`wait_s`: how long to wait for a first answer)."""
        if not self.usable:
            return None
        answer = self._answer
        if time.monotonic() - self._asked_at >= self.FRESH_S:
            self._ask()
        if answer is None and wait_s > 0:
            self._tried.wait(wait_s)
            answer = self._answer
        if answer is None or time.monotonic() - answer[0] > self.KEEP_S:
            return None
        return answer[1], answer[2]

    def allocations(self, gpus: Sequence[GpuSample], wait_s: float = 0.0) -> dict[int, ProcessOwner]:
        """NVML index -> the Slurm job its GRES gives the card to; empty where Slurm says nothing."""
        found = self.jobs(wait_s)
        if found is None:
            return {}
        jobs, minors = found
        by_minor = {g.minor_number: g for g in gpus if g.minor_number is not None}
        # Without File= lines Slurm lists the GPUs it detected by minor number.
        order = minors if minors is not None else sorted(by_minor)
        out: dict[int, ProcessOwner] = {}
        for job in jobs:
            for position in job.indices:
                gpu = by_minor.get(order[position]) if position < len(order) else None
                if gpu is not None:
                    out.setdefault(gpu.index, job.owner)
        return out

    def _ask(self) -> None:
        with self._lock:
            if self._asking:
                return
            self._asking = True
            self._asked_at = time.monotonic()
        # A daemon: a hung scontrol never holds up gpumon's exit.
        threading.Thread(target=self._refresh, name="gpumon-slurm-gres", daemon=True).start()

    def _refresh(self) -> None:
        try:
            text = self._scontrol()
            if text is not None:
                self._answer = (time.monotonic(), parse_jobs(text, self.node), self._gres_conf())
        finally:
            self._asking = False
            self._tried.set()

    def _scontrol(self) -> str | None:
        assert self.scontrol is not None and self.conf is not None
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        try:
            done = subprocess.run([self.scontrol, "-d", "-o", "show", "job"], capture_output=True, env=env,
                                  timeout=self.TIMEOUT_S, stdin=subprocess.DEVNULL, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        if done.returncode != 0:
            return None
        return done.stdout[:MAX_OUTPUT].decode("utf-8", "replace")

    def _gres_conf(self) -> list[int] | None:
        assert self.conf is not None
        try:
            with open(self.conf.parent / "gres.conf", "rb") as file:
                text = file.read(1 << 20).decode("utf-8", "replace")
        except OSError:
            return None
        return gres_minors(text, self.node)


def on_allocated_card(gpu: GpuSample, job: ProcessOwner | None) -> GpuSample:
    """The card as Slurm's job's (its JSON "owner" `job ID`, as dcgm-exporter's Slurm mapping
    names it); a process on it that cannot be seen is taken to be the job's, one that can keeps
    its own owner (someone else's process on the job's card is theirs)."""
    if job is None:
        return gpu
    processes = tuple(p.with_host_info(p.user, p.command, p.cpu_percent, p.rss, p.started, p.uid, p.container,
                                       ProcessOwner("slurm", job.id, job.name, job.user))
                      if p.owner is None else p for p in gpu.processes)
    return dataclasses.replace(gpu, owner=job.label, allocated_to=job, processes=processes)


def with_allocations(snapshot: Snapshot, slurm: SlurmGres, wait_s: float = 0.0) -> Snapshot:
    """A snapshot read without owners (a job's supervisor reads the driver alone), its cards as
    Slurm's jobs' (`wait_s`: for a first answer)."""
    allocated = slurm.allocations(snapshot.gpus, wait_s)
    if not allocated:
        return snapshot
    gpus = tuple(on_allocated_card(g, allocated.get(g.index)) for g in snapshot.gpus)
    return dataclasses.replace(snapshot, gpus=gpus)

