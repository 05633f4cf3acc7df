"""Event lines for `gpumon watch`: one JSON object per line (for pipes and logs), or text for
people; with --metrics also a line per sample."""

from __future__ import annotations

import json
import os
import time
from typing import IO

from gpumon.alerting.alert_event import AlertEvent
from gpumon.failover_event import FailoverEvent
from gpumon.model import GpuSample, Snapshot
from gpumon.sanitize import printable
from gpumon.sharing.reservations import ReservationEvent
from gpumon.units import format_bytes, format_time


class EventWriter:
    """One line per event (and per sample with --metrics), flushed at once: pipes and logs see it.
    When the reader goes away (`watch | head -1`) the writer is `closed` and writes nothing more:
    the watch ends quietly, as Unix tools do."""

    def __init__(self, stream: IO[str], fmt: str, show_hosts: bool = False) -> None:
        self.stream = stream
        self.fmt = fmt
        self.show_hosts = show_hosts  # many hosts: cards are HOST:INDEX in text
        self.closed = False

    def _line(self, text: str) -> None:
        if self.closed:
            return
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except BrokenPipeError:
            self.closed = True
            # What is still buffered goes nowhere, instead of failing again when Python exits.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)

    def event(self, event: AlertEvent | FailoverEvent | ReservationEvent) -> None:
        if self.fmt == "jsonl":
            self._line(json.dumps(event.to_dict()))
            return
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.time))
        if isinstance(event, ReservationEvent):
            self._line(f"{when}  RELEASED  GPU {event.gpu}  reservation of {printable(event.user)} ({event.reason})"
                       + (f": {printable(event.note)}" if event.note else ""))
            return
        if isinstance(event, FailoverEvent):
            self._line(f"{when}  FAILOVER  job {event.job} ({event.name})  GPU {_cards(event.from_gpus)} -> "
                       f"GPU {_cards(event.to_gpus)}  (attempt {event.attempt}: {event.reason})")
            return
        if event.holder is not None:
            self._line(_holder_text(when, event, self.show_hosts))
            return
        where = f"HOST {event.host}" if event.gpu is None else (
            f"GPU {event.host}:{event.gpu}" if self.show_hosts else f"GPU {event.gpu}")
        why = "; ".join(f"{r.code}: {r.text}" for r in event.reasons)
        self._line(f"{when}  {event.event.upper():8}  {where}  {event.rule}  "
                   f"({event.metric}={_number(event.value)}, threshold {_number(event.threshold)})  "
                   f"{event.uuid or event.error or ''}{'  ' + why if why else ''}".rstrip())

    def metrics(self, snapshot: Snapshot, host: str | None = None) -> None:
        if self.fmt == "jsonl":
            head = {"event": "sample", "time": snapshot.time} | ({"host": host} if host is not None else {})
            self._line(json.dumps(head | {"gpus": [
                {"gpu": g.index, "state": g.state, "util": g.utilization_gpu, "mem": _round(g.memory_percent),
                 "temp": g.temperature, "power": g.power_draw, "procs": len(g.processes)}
                for g in snapshot.gpus]}))
            return
        when = format_time(snapshot.time, seconds=True)
        cards = "  ".join(_card_text(g) for g in snapshot.gpus)
        self._line(f"{when}  {host + '  ' if host is not None else ''}{cards}")


def _holder_text(when: str, event: AlertEvent, show_hosts: bool) -> str:
    """`FIRING  job 77.0 (alice)  GPU 0,1  idle > 30m  idle 31m holding 20G on 2 cards  GPU-…,GPU-…`"""
    h = event.holder
    assert h is not None
    who = h.label if h.kind == "user" else f"{h.label} ({h.user or '?'})"
    cards = f"GPU {event.host + ':' if show_hosts else ''}{_cards(h.cards)}"
    state = h.idle_text() if event.event == "firing" else (
        "let go of the cards" if not h.processes else "computing again" if h.sm_util
        else "idle time not known" if h.idle_s is None else "holds less memory than the rule says")
    return printable(f"{when}  {event.event.upper():8}  {who}  {cards}  {event.rule}  {state}  "
                     f"{','.join(u or '?' for u in h.uuids)}")


def _cards(indices: tuple[int, ...]) -> str:
    return ",".join(map(str, indices))


def _number(value: float) -> str:
    return f"{value:g}" if abs(value) < 1e7 else format_bytes(int(value))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _card_text(g: GpuSample) -> str:
    if g.state != "ok":
        return f"gpu{g.index} {g.state.upper()}"
    parts = [f"gpu{g.index}"]
    parts.append(f"{g.utilization_gpu}%" if g.utilization_gpu is not None else "N/A")
    parts.append(f"mem {g.memory_percent:.0f}%" if g.memory_percent is not None else "mem N/A")
    parts.append(f"{g.temperature}C" if g.temperature is not None else "N/A")
    parts.append(f"{g.power_draw:.0f}W" if g.power_draw is not None else "N/A")
    return " ".join(parts)
