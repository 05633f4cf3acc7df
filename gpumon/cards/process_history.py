"""The recent past of each GPU process, for the TUI's process screen (Enter on a process): its GPU
memory, SM %, CPU % and resident memory, sample by sample, from the snapshots the sampler
already makes (no call to the driver or /proc of its own).

A process is known by its pid *and* its start time, so a pid the kernel hands to a new process
starts with no past. The cost stays flat however many processes come and go: at most one point
a second is kept, for `seconds` (the longest chart window), in flat arrays of doubles (40 bytes a
point, not a Python object per value); at most `most` processes are tracked, and a process not
seen for `seconds` is dropped. A process first seen while every tracked one is still running gets
no track (the process screen keeps its own points for it while it is shown): with hundreds of
processes the same ones stay tracked, and no track is made and dropped every sample.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict

from gpumon.model import ProcessSample, Snapshot

METRICS = ("gpu_memory", "sm_util", "cpu_percent", "rss")
MOST_TRACKED = 128  # processes; past that, the one unseen longest is forgotten
MIN_STEP_S = 0.95  # points closer than this to the last one are skipped (a 0.1 s interval)
NAN = math.nan

ProcessKey = tuple[int, float | None]  # (pid, start time)


def key_of(process: ProcessSample) -> ProcessKey:
    return process.pid, process.started


class Track:
    """One process's points: time and each metric, oldest first, at most `capacity` of them."""

    __slots__ = ("capacity", "_points", "_head", "seen_at", "sighted")

    WIDTH = 1 + len(METRICS)

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._points = array("d")  # row-major: time, then each metric; a ring once full
        self._head = 0  # the oldest row, once the ring is full
        self.seen_at = NAN  # the time of the newest point
        self.sighted = NAN  # the time of the newest snapshot that listed the process (a point or not)

    def __len__(self) -> int:
        return len(self._points) // self.WIDTH

    def add(self, when: float, values: tuple[float | None, ...]) -> None:
        if when - self.seen_at < MIN_STEP_S:
            return
        self.seen_at = when
        row = [when, *(NAN if v is None else float(v) for v in values)]
        if len(self) < self.capacity:
            self._points.extend(row)
            return
        start = self._head * self.WIDTH
        self._points[start:start + self.WIDTH] = array("d", row)
        self._head = (self._head + 1) % self.capacity

    def series(self, metric: str, seconds: float | None = None) -> tuple[list[float], list[float | None]]:
        """(times, values) of one metric, oldest first; the last `seconds` of it when given."""
        width, column = self.WIDTH, 1 + METRICS.index(metric)
        count = len(self)
        rows = [(self._head + i) % count for i in range(count)] if count else []
        times = [self._points[r * width] for r in rows]
        values = [self._points[r * width + column] for r in rows]
        if seconds is not None and times:
            cutoff = times[-1] - seconds
            start = next((i for i, t in enumerate(times) if t >= cutoff), len(times))
            times, values = times[start:], values[start:]
        return times, [None if math.isnan(v) else v for v in values]


def point_of(samples: list[ProcessSample]) -> tuple[float | None, ...]:
    """A process on several cards: its GPU memory added up, its busiest card's SM %."""
    memory = [p.gpu_memory for p in samples if p.gpu_memory is not None]
    sm = [p.sm_util for p in samples if p.sm_util is not None]
    first = samples[0]
    return (sum(memory) if memory else None, max(sm) if sm else None, first.cpu_percent, first.rss)


class ProcessHistory:
    def __init__(self, seconds: float = 600.0, most: int = MOST_TRACKED) -> None:
        self.seconds = seconds
        self.most = most
        self.capacity = int(seconds / MIN_STEP_S) + 1  # points a track keeps
        self._tracks: OrderedDict[ProcessKey, Track] = OrderedDict()  # least recently seen first

    def __len__(self) -> int:
        return len(self._tracks)

    def add(self, snapshot: Snapshot) -> None:
        """Every process of a fresh snapshot (a stale one repeats the past: it is not a new point)."""
        if snapshot.stale:
            return
        found: dict[ProcessKey, list[ProcessSample]] = {}
        for gpu in snapshot.gpus:
            for process in gpu.processes:
                found.setdefault(key_of(process), []).append(process)
        tracks, now = self._tracks, snapshot.time
        new = []
        for key, samples in found.items():
            track = tracks.get(key)
            if track is None:
                new.append((key, samples))
                continue
            tracks.move_to_end(key)
            track.sighted = now
            track.add(now, point_of(samples))
        cutoff = now - self.seconds
        while tracks and next(iter(tracks.values())).sighted < cutoff:
            tracks.popitem(last=False)
        for key, samples in new:
            if len(tracks) >= self.most:
                if next(iter(tracks.values())).sighted >= now:  # every tracked one is running: no room
                    break
                tracks.popitem(last=False)  # the one unseen longest
            track = tracks[key] = Track(self.capacity)
            track.sighted = now
            track.add(now, point_of(samples))

    def track(self, process: ProcessSample) -> Track | None:
        """The process's points (the object itself: it keeps them after the process is dropped here)."""
        return self._tracks.get(key_of(process))
