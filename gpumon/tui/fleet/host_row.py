"""One fleet host as one line of the overview, in words and glyphs (no Textual here: what a row
says is decided once per host update, and the table only draws it).

Each card is two cells: a shade for its utilisation and a bar for its memory in use, so the strip
reads the same in 16 colours and in monochrome (colour only repeats what the glyphs say, as in a
host's own view: utilisation in the primary colour, memory green, amber from 80 %, red from 95 %):

    ·  idle    ░ light   ▒ half   ▓ busy   █ full        memory: (empty) ▁▂▃▄▅▆▇█ (full)
    ××  lost    !!  error    ~~  not responding    M3  in MIG mode, 3 slices    ?   not reported

Beside the strip, the host's health: the worst verdict of its cards and how many cards have it
(`FAIL 1`, `WARN 2`, `ok`), blank where no card has a verdict (nvidia-smi hosts, older gpumon).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpumon.jobs.placement import free_enough
from gpumon.model import GpuSample, HostStatus
from gpumon.sanitize import printable

MEMORY = " ▁▂▃▄▅▆▇█"
LEGEND = ("· ░ ▒ ▓ █ utilisation  ▁▃▅█ memory  ×× lost  ~~ not responding  M3 MIG, 3 slices  "
          "grey: a host's last reading")
AWAY = ("connecting", "reconnecting", "unreachable", "error")  # no fresh data: free cards not counted


@dataclass(frozen=True, slots=True)
class Cell:
    """Two cells of the strip: the utilisation glyph and its tone, the memory glyph and its tone."""

    util: str
    util_tone: str  # idle | busy | unknown | lost | stale | mig | old
    mem: str
    mem_tone: str  # mem | memwarn | full | unknown | lost | stale | mig | old


@dataclass(frozen=True, slots=True)
class HostRow:
    name: str
    state: str  # the state in a word or two ("stale 12s")
    state_tone: str  # live | stale | away | bad | muted
    cards: tuple[Cell, ...]
    free: int | None  # free whole cards (None: no reading)
    total: int
    load: float | None  # mean utilisation of the cards that report it, %
    hottest: tuple[int, int] | None  # (°C, card index)
    note: str  # why it is away, when it tries again, or how it is read
    note_tone: str  # muted | bad | warn
    live: bool  # fresh data: its free cards count in the fleet's total
    words: str = ""  # what the `/` filter looks in: name, state, source, why it is away, health (lower case)
    health: str = ""  # "FAIL 1", "WARN 2", "ok"; "" where no card has a verdict
    health_tone: str = ""  # bad | caution | muted
    health_rank: tuple[int, int] | None = None  # (2 fail / 1 warn / 0 ok, cards): what sorting by health compares

    def matches(self, needle: str) -> bool:
        return needle.lower() in self.words


def _util_glyph(util: int | None) -> tuple[str, str]:
    if util is None:
        return "?", "unknown"
    if util < 5:
        return "·", "idle"
    return ("░" if util < 30 else "▒" if util < 60 else "▓" if util < 85 else "█"), "busy"


def _mem_glyph(gpu: GpuSample) -> tuple[str, str]:
    pct = gpu.memory_percent
    if pct is None:
        return "?", "unknown"
    # Toned as the memory bars of a host's view: from 80 % a warning, from 95 % full.
    return MEMORY[min(8, max(0, round(pct / 12.5)))], "full" if pct >= 95 else "memwarn" if pct >= 80 else "mem"


def card_cell(gpu: GpuSample, old: bool = False) -> Cell:
    """`old`: the host is away or late, so this is its last reading (drawn grey)."""
    if gpu.state == "lost":
        return Cell("×", "lost", "×", "lost")
    if gpu.state == "error":
        return Cell("!", "lost", "!", "lost")
    if gpu.state == "stale" and not old:
        return Cell("~", "stale", "~", "stale")
    if gpu.mig_mode:
        count = len(gpu.mig_devices)
        cell = Cell("M", "mig", str(count) if 0 < count < 10 else "+" if count else "·", "mig")
    else:
        util, util_tone = _util_glyph(gpu.utilization_gpu)
        mem, mem_tone = _mem_glyph(gpu)
        cell = Cell(util, util_tone, mem, mem_tone)
    return Cell(cell.util, "old", cell.mem, "old") if old else cell


def _seconds(value: float) -> str:
    s = max(0, int(value))
    return f"{s}s" if s < 120 else f"{s // 60}m"


def describe_state(status: HostStatus, now: float) -> tuple[str, str, str, str]:
    """(state, its tone, note, its tone)."""
    error = printable(status.error or "")
    note = printable(status.note or "")
    retry = f"retry in {_seconds(status.retry_at - now)}" if status.retry_at is not None else ""
    if status.state == "live":
        if status.source == "nvidia-smi":
            return "live", "live", note or "read through nvidia-smi", "warn"
        if status.source == "prometheus":
            return "live", "live", note or "read through Prometheus (read-only)", "muted"
        return "live", "live", note, "muted"
    if status.state == "stale":
        return f"stale {_seconds(now - status.since)}", "stale", error or "no new data", "warn"
    if status.state == "connecting":
        return "connecting…", "muted", "", "muted"
    if status.state == "reconnecting":
        return "reconnecting…", "away", f"last try: {error}" if error else "", "muted"
    words = " · ".join(w for w in (error, retry) if w)
    return status.state, "bad" if status.state == "error" else "away", words, "bad"


def host_row(status: HostStatus, now: float) -> HostRow:
    """What the overview shows of one host at `now` (countdowns and "stale for" depend on it)."""
    state, state_tone, note, note_tone = describe_state(status, now)
    source = status.source if status.source != "gpumon" else ""  # "nvidia-smi" finds those hosts
    words = " ".join((status.host, status.state, source, status.error or "")).lower()
    snapshot = status.snapshot
    if snapshot is None:
        return HostRow(printable(status.host), state, state_tone, (), None, 0, None, None, note, note_tone,
                       live=False, words=words)
    live = status.state == "live"
    old = status.state != "live"
    cards = tuple(card_cell(g, old) for g in snapshot.gpus)
    health, health_tone, rank, codes = host_health(snapshot.gpus)
    words = " ".join(w for w in (words, health.lower(), codes) if w)
    taken = dict(status.taken)  # claimed or reserved by someone else: not free for this user, as select says
    free = sum(1 for g in snapshot.gpus if free_enough(g) is None and g.ref not in taken)
    if live and not note and (taken or status.mine):  # who has the cards, as the host view says per card
        note = _held_note(taken, status.mine)
    utils = [g.utilization_gpu for g in snapshot.gpus if g.state == "ok" and g.utilization_gpu is not None]
    temps = [(g.temperature, g.index) for g in snapshot.gpus if g.state == "ok" and g.temperature is not None]
    return HostRow(printable(status.host), state, state_tone, cards, free, len(snapshot.gpus),
                   sum(utils) / len(utils) if utils else None, max(temps) if temps else None,
                   note, note_tone, live=live, words=words, health=health,
                   health_tone=health_tone if live else "muted", health_rank=rank)


def _held_note(taken: dict[str, str], mine: frozenset[str]) -> str:
    """'2 claimed, 1 reserved by others · 1 reserved by you'."""
    claimed = sum(1 for words in taken.values() if words.startswith("claimed"))
    reserved = len(taken) - claimed
    theirs = ", ".join(part for part in (f"{claimed} claimed" if claimed else "",
                                         f"{reserved} reserved" if reserved else "") if part)
    return " · ".join(part for part in (f"{theirs} by others" if theirs else "",
                                        f"{len(mine)} reserved by you" if mine else "") if part)


def host_health(gpus: Sequence[GpuSample]) -> tuple[str, str, tuple[int, int] | None, str]:
    """(the words, their tone, the rank to sort by, the reasons' codes for the filter) of a host's cards'
    verdicts. A lost card counts: its verdict is fail, whatever the strip says of it."""
    verdicts = [g.health for g in gpus if g.health is not None]
    if not verdicts:
        return "", "", None, ""
    failing = sum(1 for v in verdicts if v.verdict == "fail")
    warning = sum(1 for v in verdicts if v.verdict == "warn")
    codes = " ".join(sorted({r.code for v in verdicts for r in v.reasons}))
    if failing:
        return f"FAIL {failing}", "bad", (2, failing), codes
    if warning:
        return f"WARN {warning}", "caution", (1, warning), codes
    return "ok", "muted", (0, 0), codes


def time_dependent(status: HostStatus) -> bool:
    """Whether the row's words change with the clock alone (a countdown, "stale for")."""
    return status.state == "stale" or (status.retry_at is not None and status.state in ("unreachable", "error"))
