"""Plain-text tables for the terminal: `gpumon snapshot`, `gpumon topo`, `gpumon jobs` and `gpumon users`.

Widths are terminal cells, not code points (a CJK character or an emoji takes two), and text from
the driver or other users is cut to its column with `…`, so one long name never pushes the rest
of the table off the screen.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from rich.cells import cell_len, set_cell_size

from gpumon.health.verdicts import card_verdict
from gpumon.jobs.attempts import describe
from gpumon.model import GpuSample, Snapshot, Topology
from gpumon.owners.holders import Holder
from gpumon.sanitize import printable
from gpumon.units import format_bytes, format_duration, format_energy, format_runtime

NA = "N/A"
NAME_CELLS = 36  # a card name ("NVIDIA RTX 6000 Ada Generation" is 30)
USER_CELLS = 24
OWNER_CELLS = 32  # "ml-team/train-llama-7f9c6d-x2x4q (pytorch)" is cut; "job 4242_7.0" is not
COMMAND_CELLS = 120
JOB_NAME_CELLS = 20
HOST_CELLS = 24


def fit(text: str, cells: int) -> str:
    """`text` cut to at most `cells` terminal cells, ending in `…` when it was cut."""
    if cell_len(text) <= cells:
        return text
    return set_cell_size(text, cells - 1).rstrip() + "…"


def _fmt(value: object, suffix: str = "") -> str:
    if value is None:
        return NA
    if isinstance(value, float):
        return f"{value:.0f}{suffix}"
    return f"{value}{suffix}"


def table(rows: list[list[str]], right: set[int] = frozenset()) -> str:
    """Align columns; columns in `right` are right-aligned (numbers)."""
    widths = [max(cell_len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        padded = [" " * (w - cell_len(cell)) + cell if i in right else cell + " " * (w - cell_len(cell))
                  for i, (cell, w) in enumerate(zip(row, widths))]
        lines.append("  ".join(padded).rstrip())
    return "\n".join(lines)


def _memory(gpu: GpuSample) -> str:
    if gpu.memory_used is None:
        return NA
    return f"{format_bytes(gpu.memory_used)} / {format_bytes(gpu.memory_total)}"


def _power(gpu: GpuSample) -> str:
    if gpu.power_draw is None:
        return NA
    return f"{gpu.power_draw:.0f} / {_fmt(gpu.power_limit, 'W')}"


FABRIC_WORDS = {
    "not_started": "not started: the card is not registered (is nvidia-fabricmanager running?)",
    "in_progress": "registration in progress",
    "failed": "registration failed (see the fabric manager's log)",
    "degraded": "degraded (NVLink bandwidth or routes reduced)",
}


def _state_words(gpu: GpuSample) -> str:
    if gpu.state == "stale":
        return f"not responding for {gpu.stale_s or 0:.0f} s" + (" (its last values are shown)"
                                                                 if gpu.utilization_gpu is not None else "")
    if not gpu.error:
        return gpu.state
    return gpu.error if gpu.state in gpu.error.lower() else f"{gpu.state}: {gpu.error}"


def snapshot_text(snapshot: Snapshot, shared: Mapping[int, str] | None = None) -> str:
    """The cards and processes for people; `shared`: who claims or reserved each card (by index, in
    words: sharing/view.card_words), said under the table."""
    header = (
        f"{snapshot.host}  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(snapshot.time))}  "
        f"driver {snapshot.driver_version or NA}  CUDA {snapshot.cuda_driver_version or NA}"
    )
    if snapshot.backend != "nvml":
        header += (f"  [{snapshot.backend.upper()}: simulated data]" if snapshot.backend == "demo"
                   else f"  [{snapshot.backend.upper()}]")
    if not snapshot.gpus:
        return header + "\n\nNo NVIDIA GPUs found.\n"
    gpu_rows = [["GPU", "NAME", "STATE", "UTIL", "MEMORY", "TEMP", "FAN", "POWER", "SM CLK", "PSTATE", "BUS ID"]]
    notes = []
    for g in snapshot.gpus:
        if g.state != "ok":
            notes.append(f"GPU {g.index}: {_state_words(g)}")
        if g.fabric not in (None, "ready"):
            notes.append(f"GPU {g.index}: NVSwitch fabric {FABRIC_WORDS.get(g.fabric, g.fabric)}")
        if g.compute_mode not in (None, "default"):
            notes.append(f"GPU {g.index}: compute mode {printable(g.compute_mode).upper()}"
                         + (" (one process at a time)" if g.compute_mode.startswith("exclusive") else ""))
        if g.asleep and g.state == "ok":
            notes.append(f"GPU {g.index}: asleep (the kernel suspended it); not read, so as not to wake it")
        if (g.state != "ok" and g.utilization_gpu is None) or (g.asleep and g.state == "ok"):
            gpu_rows.append([str(g.index), fit(g.name, NAME_CELLS), "ASLEEP" if g.asleep else g.state.upper(),
                             "", "", "", "", "", "", "", g.pci_bus_id or NA])
            continue
        verdict = card_verdict(g)  # the word health, the TUI and the page give the card
        if g.state == "ok" and verdict.verdict != "ok":
            notes += [f"GPU {g.index}: {verdict.verdict.upper()}: {r.code}: {r.text} -> {r.action}"
                      for r in verdict.reasons]
        gpu_rows.append([
            str(g.index), fit(g.name, NAME_CELLS), verdict.verdict.upper() if g.state == "ok" else g.state.upper(),
            _fmt(g.utilization_gpu, "%"), _memory(g),
            _fmt(g.temperature, "C"), _fmt(g.fan, "%"), _power(g), _fmt(g.clock_sm, "MHz"),
            g.pstate or NA, g.pci_bus_id or NA,
        ])
    notes += [f"GPU {index}: {words}" for index, words in sorted((shared or {}).items()) if words]
    out = [header, "", table(gpu_rows, right={0, 3, 5, 6, 8})]
    if notes:
        out += [""] + notes
    mig_rows = [["GPU", "MIG SLICE (use with --gpu)", "NAME", "MEMORY"]] + [
        [str(g.index), m.uuid, fit(m.name, NAME_CELLS),
         f"{format_bytes(m.memory_used)} / {format_bytes(m.memory_total)}"]
        for g in snapshot.gpus for m in g.mig_devices
    ]
    if len(mig_rows) > 1:
        out += ["", table(mig_rows, right={0})]
    proc_rows = [["GPU", "PID", "USER", "TYPE", "GPU MEM", "SM%", "CPU%", "OWNER", "COMMAND"]]
    for g in snapshot.gpus:
        for p in sorted(g.processes, key=lambda p: -(p.gpu_memory or 0)):
            proc_rows.append([
                str(g.index), str(p.pid), fit(p.user or "?", USER_CELLS), p.type[0].upper(), format_bytes(p.gpu_memory),
                _fmt(p.sm_util), _fmt(p.cpu_percent), fit(p.owner.label if p.owner else "-", OWNER_CELLS),
                fit(p.command or "?", COMMAND_CELLS),
            ])
    out.append("")
    out.append(table(proc_rows, right={0, 1, 4, 5, 6}) if len(proc_rows) > 1 else "No processes on any GPU.")
    return "\n".join(out) + "\n"


TOPOLOGY_LEGEND = """Legend:
  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
  XGMI = AMD cards of one xGMI hive (Infinity Fabric); how many links sysfs does not say"""


def topology_text(topo: Topology) -> str:
    names = [f"GPU{i}" for i in topo.indices]
    rows = [[""] + names + ["CPU Affinity", "NUMA Affinity"]]
    for i, name in enumerate(names):
        rows.append([name] + [cell or NA for cell in topo.links[i]]
                    + [topo.cpu_affinity[i] or NA, _fmt(topo.numa_node[i])])
    left_out = "".join(f"GPU{index} left out: {reason}\n" for index, reason in topo.left_out)
    left_out += "".join(f"GPU{index} {reason}\n" for index, reason in topo.unknown)
    matrix = table(rows) + "\n\n" if topo.indices else "No cards to show.\n\n"
    return matrix + (left_out + "\n" if left_out else "") + TOPOLOGY_LEGEND + "\n"


def jobs_text(jobs: list) -> str:
    """`gpumon jobs`: one row per job, oldest first."""
    if not jobs:
        return "No jobs. Start one with: gpumon run --gpu 0 -- python train.py\n"
    rows = [["ID", "NAME", "STATE", "GPU", "PID", "EXIT", "RUNTIME", "PEAK MEM", "LIMIT", "ENERGY",
             "LOG / REASON"]]
    for job in jobs:
        exit_text = job.signal or ("" if job.exit_code is None else str(job.exit_code))
        rows.append([
            job.spec.id, fit(job.spec.name, JOB_NAME_CELLS), job.state_text,
            ",".join(map(str, job.spec.gpu_indices)) or "-",
            str(job.pid or ""), exit_text, format_runtime(job.runtime), format_bytes(job.peak_gpu_memory, na=""),
            format_bytes(job.spec.limit, na=""), format_energy(job.energy_j, job.energy_shared),
            job.reason or str(job.log),
        ])
    lines = table(rows).split("\n")
    out = lines[:1]
    for job, line in zip(jobs, lines[1:]):
        out.append(line)
        if len(job.attempts) > 1:  # a job that moved (--failover): where it ran, and why it left
            out += [f"    {describe(a)}" for a in job.attempts]
    return "\n".join(out) + "\n"


USERS_HEADER = ["WHO", "USER", "CARDS", "MEM", "SM%", "POWER", "ENERGY", "HELD", "IDLE"]
USERS_RIGHT = {3, 4, 5, 6, 7, 8}  # numbers (without a HOST column)
# `users --hosts` prints each host's rows as it answers, before the others are known: fixed widths.
USERS_WIDTHS = [OWNER_CELLS, USER_CELLS, 7, 6, 5, 6, 9, 7, 6]


def users_text(holders: list[Holder], show_hosts: bool = False) -> str:
    """`gpumon users`: a row per user, its jobs, pods and containers indented under it (a job's
    steps under the job). IDLE: how
    long every process of it has shown 0 % SM as gpumon saw it; `-` computing, N/A not known."""
    if not holders:
        return "Nobody holds a card.\n"
    rows = [(["HOST"] if show_hosts else []) + USERS_HEADER, *users_rows(holders, show_hosts)]
    first = 1 if show_hosts else 0
    return table(rows, right={first + i for i in USERS_RIGHT}) + "\n"


def users_rows(holders: list[Holder] | tuple[Holder, ...], show_hosts: bool) -> list[list[str]]:
    """The cells of each row of users_text (no header)."""
    # A job under its user's row, a job's steps under the job when it has several; one with no
    # user (a card a cluster's Prometheus names) stands alone.
    shown = [(h, 0 if h.kind == "user" or h.user is None else 2) for h in holders]
    shown = [row for h, indent in shown
             for row in [(h, indent), *((s, indent + 2) for s in (h.steps if len(h.steps) > 1 else ()))]]
    rows = []
    for h, indent in shown:
        idle = format_duration(h.idle_s) if h.idle_s is not None else ("-" if h.sm_util is not None else NA)
        label = printable(h.label)  # names from other users' cgroups, pods and containers
        who = " " * indent + fit(label, OWNER_CELLS - indent)
        rows.append(([fit(printable(h.host), HOST_CELLS)] if show_hosts else []) + [
            who, fit(printable(h.user or "?"), USER_CELLS), ",".join(map(str, h.cards)), format_bytes(h.gpu_memory),
            _fmt(h.sm_util), _fmt(h.power_w, "W"), _energy(h.energy_j),
            format_duration(h.held_s) if h.held_s is not None else NA, idle,
        ])
    return rows


def fixed_lines(rows: list[list[str]], widths: list[int], right: set[int] = frozenset()) -> str:
    """Rows in columns of the widths given (a longer cell pushes its line's next ones along): rows
    printed a few at a time line up with the ones printed before."""
    def cell(i: int, text: str) -> str:
        pad = " " * max(0, widths[i] - cell_len(text))
        return pad + text if i in right else text + pad

    return "".join("  ".join(cell(i, text) for i, text in enumerate(row)).rstrip() + "\n" for row in rows)


def _energy(joules: float | None) -> str:
    """Wh, as jobs show it; a short window's few joules with two decimals rather than 0.0 Wh."""
    if joules is not None and joules < 36_000:
        return f"{joules / 3600:.2f} Wh"
    return format_energy(joules, na=NA)
