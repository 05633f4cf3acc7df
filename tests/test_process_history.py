"""Each process's recent past (cards/process_history.py), as the process screen charts it: by pid and
start time (a reused pid starts with no past), bounded in length and in processes, fed only by
fresh snapshots."""

from __future__ import annotations

import sys

from gpumon.cards.process_history import ProcessHistory, Track
from gpumon.model import GpuSample, ProcessSample, Snapshot


def snapshot(when: float, *procs: tuple[int, int, float | None, int | None], stale: bool = False) -> Snapshot:
    """procs: (card, pid, started, sm)."""
    gpus = []
    for index in sorted({card for card, *_ in procs} | {0}):
        processes = tuple(ProcessSample(pid, "compute", gpu_memory=(pid % 7 + 1) << 30, sm_util=sm, started=started,
                                        cpu_percent=12.5, rss=1 << 28)
                          for card, pid, started, sm in procs if card == index)
        gpus.append(GpuSample(index, f"GPU-{index}", "A10", f"0000:0{index}:00.0", processes=processes))
    return Snapshot(when, "box", "nvml", "550", "12.4", tuple(gpus), stale=stale)


def test_a_process_keeps_its_points_and_a_reused_pid_starts_over():
    history = ProcessHistory(seconds=60)
    for t in range(10):
        history.add(snapshot(1000.0 + t, (0, 42, 900.0, t * 10)))
    track = history.track(ProcessSample(42, "compute", started=900.0))
    times, sm = track.series("sm_util")
    assert times == [1000.0 + t for t in range(10)] and sm == [t * 10 for t in range(10)]
    assert track.series("sm_util", 3.0)[1] == [60, 70, 80, 90]
    # The kernel gives pid 42 to another process: it has no past, and the old one's is not its.
    history.add(snapshot(1010.0, (0, 42, 1009.5, 5)))
    newcomer = history.track(ProcessSample(42, "compute", started=1009.5))
    assert newcomer.series("sm_util")[1] == [5]


def test_a_process_on_two_cards_adds_its_memory_and_charts_its_busiest_card():
    history = ProcessHistory()
    history.add(snapshot(5.0, (0, 8, 1.0, 30), (1, 8, 1.0, 70)))
    track = history.track(ProcessSample(8, "compute", started=1.0))
    assert track.series("gpu_memory")[1] == [2 * (8 % 7 + 1) << 30]
    assert track.series("sm_util")[1] == [70]
    assert track.series("cpu_percent")[1] == [12.5] and track.series("rss")[1] == [1 << 28]


def test_unknown_values_stay_unknown():
    history = ProcessHistory()
    history.add(snapshot(5.0, (0, 8, None, None)))
    assert history.track(ProcessSample(8, "compute")).series("sm_util")[1] == [None]


def test_stale_snapshots_and_faster_samples_add_no_points():
    history = ProcessHistory()
    history.add(snapshot(100.0, (0, 1, 1.0, 10)))
    history.add(snapshot(100.0, (0, 1, 1.0, 99), stale=True))  # the past again, marked stale
    history.add(snapshot(100.5, (0, 1, 1.0, 20)))  # --interval 0.5: one point a second is kept
    history.add(snapshot(101.0, (0, 1, 1.0, 30)))
    assert history.track(ProcessSample(1, "compute", started=1.0)).series("sm_util")[1] == [10, 30]


def test_length_is_bounded_by_the_window():
    track = Track(capacity=5)
    for t in range(12):
        track.add(float(t), (1.0, float(t), None, None))
    times, values = track.series("sm_util")
    assert len(track) == 5 and times == [7.0, 8.0, 9.0, 10.0, 11.0] and values == times


def test_tracked_processes_are_bounded_and_the_gone_are_dropped():
    history = ProcessHistory(seconds=30, most=16)
    for t in range(40):  # a new short-lived process every second
        history.add(snapshot(float(t), (0, 1000 + t, float(t), 1)))
    assert len(history) == 16
    assert history.track(ProcessSample(1039, "compute", started=39.0)) is not None
    assert history.track(ProcessSample(1000, "compute", started=0.0)) is None  # the longest unseen went first
    history.add(snapshot(100.0, (0, 7, 99.0, 1)))  # 30 s on, the others are not seen any more
    assert len(history) == 1


def test_memory_stays_flat_with_many_processes():
    history = ProcessHistory(seconds=600, most=128)
    for t in range(605):
        history.add(snapshot(float(t), *((t % 8, p, 1.0, 50) for p in range(160))))
    assert len(history) == 128
    points = sum(len(track) for track in history._tracks.values())
    assert points <= 128 * history.capacity
    size = sum(sys.getsizeof(track._points) for track in history._tracks.values())
    assert size < 128 * history.capacity * 5 * 8 * 1.2  # doubles in arrays, not Python objects


def test_a_newcomer_waits_for_room_while_every_tracked_process_runs():
    history = ProcessHistory(most=2)
    history.add(snapshot(1.0, (0, 1, 1.0, 10), (0, 2, 1.0, 20)))
    history.add(snapshot(2.0, (0, 1, 1.0, 11), (0, 2, 1.0, 21), (0, 3, 2.0, 30)))
    assert history.track(ProcessSample(3, "compute", started=2.0)) is None, "no track made to be dropped"
    assert history.track(ProcessSample(1, "compute", started=1.0)).series("sm_util")[1] == [10, 11]
    history.add(snapshot(3.0, (0, 2, 1.0, 22), (0, 3, 2.0, 31)))  # pid 1 has exited: its place goes to 3
    assert history.track(ProcessSample(3, "compute", started=2.0)).series("sm_util")[1] == [31]
    assert history.track(ProcessSample(1, "compute", started=1.0)) is None
