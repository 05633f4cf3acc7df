"""Fixed demo scenes: the app at a frozen clock with history already filled, and the list of
screenshots. Shared by scripts/screenshots.py and the tests, so both see the same screens."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from fleet_scenes import card, machine, scene_fleet

from gpumon.alerting.rules import parse_rules
from gpumon.cards.backends.demo import DemoBackend
from gpumon.jobs.records import JobSpec
from gpumon.tui.app import GpumonApp, create_app
from gpumon.tui.fleet.app import FleetApp

FROZEN = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
GIB = 1 << 30
HISTORY = 300  # samples of chart history taken before the first frame

# (file name, demo_app options, terminal size, keys pressed before the shot)
SHOTS: list[tuple[str, dict, tuple[int, int], tuple[str, ...]]] = [
    ("main-200x60.svg", {}, (200, 60), ()),
    ("main-120x40.svg", {}, (120, 40), ()),
    ("main-80x24.svg", {}, (80, 24), ()),
    ("filter-120x40.svg", {}, (120, 40), ("slash", "a", "l", "i", "c", "e")),
    ("help-120x40.svg", {}, (120, 40), ("question_mark",)),
    ("light-120x40.svg", {"theme": "gpumon-light"}, (120, 40), ("down", "down")),
    ("hot-120x40.svg", {"scenario": "hot"}, (120, 40), ()),
    ("lost-120x40.svg", {"scenario": "lost"}, (120, 40), ()),
    ("sixteen-cards-120x40.svg", {"cards": 16}, (120, 40), ()),
    ("topology-80x24.svg", {"cards": 8}, (80, 24), ("down", "t")),
    ("alerts-120x40.svg", {"scenario": "hot", "rules": ["temp > 85 for 10s", "throttle thermal"]}, (120, 40), ()),
    ("run-dialog-120x40.svg", {}, (120, 40), ("down", "down", "down", "r", *"python train.py --lr 3e-4")),
    ("jobs-120x40.svg", {}, (120, 40), ("J",)),
    ("fleet-120x40.svg", {"fleet": True}, (120, 40), ()),
    ("mixed-120x40.svg", {"scenario": "mixed"}, (120, 40), ()),
    ("users-120x40.svg", {}, (120, 40), ("u",)),
    ("process-120x40.svg", {}, (120, 40), ("tab", "enter")),
]


def demo_app(scenario: str = "default", theme: str | None = None, cards: int | None = None,
             env: dict[str, str] | None = None, readonly: bool = False, rules: list[str] | None = None,
             fleet: bool = False) -> GpumonApp:
    """A demo app whose clock is frozen, with HISTORY samples already in its charts.

    The app then samples once more (its first frame) and stops, so the screen stays still.
    `fleet`: the fleet overview of a frozen lab instead (fleet_app()).
    """
    if fleet:
        return fleet_app(theme)
    clock = [FROZEN - HISTORY]

    def tick() -> float:
        clock[0] += 1.0
        return clock[0]

    backend = DemoBackend(scenario, seed=0, cards=cards, clock=tick)
    backend.host = "demo-gpu-node"
    app = create_app(backend, interval=1.0, theme=theme, env=env or {}, sample_count=1, readonly=readonly,
                     rules=parse_rules(rules or []), backend_args={"demo": scenario})
    app.launch_cwd = "/home/alice/llm"
    for _ in range(HISTORY - 1):
        snapshot = app.sampler.collect()
        app.sampler.history.add(snapshot)
        app.process_history.add(snapshot)  # the process screen's charts (Enter)
        app.engine.evaluate(snapshot)  # rules see the history too, so `for` durations have passed
        app.holders.update(snapshot)  # and the users view: idle for as long as the charts go back
    return app


def fleet_app(theme: str | None = None) -> FleetApp:
    """The fleet overview of a frozen lab: hosts in every state the overview shows, the clock
    stopped (a stand-in source: no ssh in screenshots)."""
    clock = [FROZEN]
    busy = (8, 5, 8, 2, 0, 7, 8, 3, 8, 8, 1, 6, 8, 4, 0, 8, 7, 8, 2, 8, 5, 8, 0, 6, 8)
    gpus = [f"gpu{i + 1:02d}" for i in range(len(busy))]
    lab = scene_fleet(gpus[:8] + ["dgx-a100", "ws-alice", "gpu90", "gpu91", "gpu92", "old-node", "local"]
                        + gpus[8:], clock=lambda: clock[0])
    draw = random.Random(7)

    unwell = {"gpu03": {5: "fail"}, "gpu06": {1: "warn", 6: "warn"}}  # the HEALTH column's cases

    def h100s(host: str, busy: int) -> list:
        return [card(i, util=draw.choice((92, 97, 100, 71)) if i < busy else draw.choice((0, 0, 3)),
                     mem_pct=draw.uniform(60, 96) if i < busy else draw.choice((0.0, 0.4, 1.2)),
                     temp=draw.randint(62, 84) if i < busy else draw.randint(29, 36), host=host,
                     health=unwell.get(host, {}).get(i, "ok")) for i in range(8)]

    for host, used in zip(gpus, busy):
        lab.report(host, "live", snapshot=machine(host, h100s(host, used), FROZEN))
    lab.report("dgx-a100", "live", snapshot=machine("dgx-a100", [
        card(0, util=88, mem_pct=72, temp=77, host="dgx", name="NVIDIA A100-SXM4-80GB"),
        card(1, host="dgx", mig=3, name="NVIDIA A100-SXM4-80GB"),
        card(2, host="dgx", mig=7, name="NVIDIA A100-SXM4-80GB"),
        card(3, util=45, mem_pct=30, temp=63, host="dgx", name="NVIDIA A100-SXM4-80GB"),
        card(4, host="dgx", state="lost", name="NVIDIA A100-SXM4-80GB"),
        card(5, util=30, mem_pct=50, temp=58, host="dgx", state="stale", name="NVIDIA A100-SXM4-80GB"),
        card(6, util=0, temp=33, host="dgx", name="NVIDIA A100-SXM4-80GB"),
        card(7, util=0, temp=34, host="dgx", name="NVIDIA A100-SXM4-80GB")], FROZEN))
    lab.report("ws-alice", "live", source="nvidia-smi", snapshot=machine("ws-alice", [
        card(0, util=64, mem_pct=81, temp=71, host="ws", name="NVIDIA GeForce RTX 4090", total=24 * GIB),
        card(1, util=0, mem_pct=2, temp=38, host="ws", name="NVIDIA GeForce RTX 4090", total=24 * GIB)], FROZEN))
    clock[0] = FROZEN - 9  # silent for 9 s
    lab.report("gpu90", "live", snapshot=machine("gpu90", h100s("gpu90", 4), FROZEN - 12))
    lab.report("gpu90", "stale", error="no data for 3 s")
    clock[0] = FROZEN
    lab.report("gpu91", "unreachable", error="connection refused", retry_at=FROZEN + 12)
    lab.report("gpu92", "reconnecting", error="timeout")
    lab.report("old-node", "error", error="gpumon there is too old: schema 2 is unknown here", retry_at=FROZEN + 30)
    lab.report("local", "live", source="local", snapshot=machine("local", [
        card(i, util=(0, 41, 0, 12)[i], mem_pct=(0.5, 38, 0, 9)[i], temp=(31, 66, 30, 47)[i], host="local",
             name="NVIDIA RTX A6000", total=48 * GIB) for i in range(4)], FROZEN))
    return FleetApp(lab, theme=theme, env={}, clock=lambda: FROZEN)


async def wait_for_first_frame(pilot) -> None:
    if isinstance(pilot.app, FleetApp):  # its hosts were reported before it started
        await pilot.pause(0.3)
        return
    while pilot.app.sampler.latest is None:
        await pilot.pause(0.05)
    await pilot.pause(0.2)


SHOWCASE_STATE = Path(tempfile.gettempdir()) / "gpumon-showcase-state"


@contextlib.contextmanager
def showcase_state() -> Iterator[Path]:
    """Point gpumon's state dir (jobs, history) at a fresh fixed folder with the demo jobs in it.

    The folder's path shows on screen (the jobs panel's log path), so it is the same everywhere;
    a lock keeps two runs on one machine (two checkouts' test suites) from sharing it at once.
    """
    with open(Path(tempfile.gettempdir()) / "gpumon-showcase.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        previous = os.environ.get("XDG_STATE_HOME")
        shutil.rmtree(SHOWCASE_STATE, ignore_errors=True)
        os.environ["XDG_STATE_HOME"] = str(SHOWCASE_STATE)
        write_demo_jobs(SHOWCASE_STATE)
        try:
            yield SHOWCASE_STATE
        finally:
            shutil.rmtree(SHOWCASE_STATE, ignore_errors=True)
            if previous is None:
                os.environ.pop("XDG_STATE_HOME", None)
            else:
                os.environ["XDG_STATE_HOME"] = previous


def write_demo_jobs(state_home: Path) -> None:
    """Finished jobs with fixed times, so the jobs panel renders the same everywhere."""
    jobs_root = state_home / "gpumon" / "jobs"
    examples = [
        ("20260101-083000-1a2b", "train", ["python", "train.py", "--epochs", "3"], 3, 0, None, 52, 61.5),
        ("20260101-091500-3c4d", "sweep", ["python", "sweep.py", "--lr", "1e-3"], 2, None,
         "memory limit exceeded: 22G > 20G", 15, 22.0),
        ("20260101-101000-5e6f", "eval", ["python", "eval.py"], 3, 1, None, 4, 9.5),
    ]
    for job_id, name, command, gpu, code, reason, minutes, peak_gib in examples:
        directory = jobs_root / job_id
        directory.mkdir(parents=True, exist_ok=True)
        created = FROZEN - 6 * 3600 + int(job_id[9:11]) * 60
        spec = JobSpec(id=job_id, name=name, command=command, gpu_spec=str(gpu), cwd="/home/alice/llm",
                       created=created, gpus=[f"GPU-demo-{gpu}"], gpu_indices=[gpu],
                       mem_limit=20 * GIB if reason else None)
        (directory / "job.json").write_text(json.dumps(dataclasses.asdict(spec)))
        (directory / "process.json").write_text(json.dumps({"pid": 40000 + gpu, "started": created + 1}))
        (directory / "exit.json").write_text(json.dumps({
            "exit_code": code, "signal": 15 if reason else None, "ended": created + 1 + minutes * 60,
            "reason": reason}))
        (directory / "peak").write_text(str(int(peak_gib * GIB)))
        (directory / "output.log").write_text(
            "".join(f"epoch {e}: loss {2.5 / (e + 1):.3f}\n" for e in range(3)) + ("done\n" if code == 0 else ""))
    (state_home / "gpumon" / "history").write_text("python eval.py\npython train.py --epochs 3\n")
