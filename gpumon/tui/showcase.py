"""Fixed demo scenes: the app at a frozen clock with history already filled, and the list of
screenshots. Shared by scripts/screenshots.py and the tests, so both see the same screens."""

from __future__ import annotations

from gpumon.alerts import parse_rules
from gpumon.backends.demo import DemoBackend
from gpumon.tui.app import GpumonApp, create_app

FROZEN = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
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
]


def demo_app(scenario: str = "default", theme: str | None = None, cards: int | None = None,
             env: dict[str, str] | None = None, readonly: bool = False, rules: list[str] | None = None) -> GpumonApp:
    """A demo app whose clock is frozen, with HISTORY samples already in its charts.

    The app then samples once more (its first frame) and stops, so the screen stays still.
    """
    clock = [FROZEN - HISTORY]

    def tick() -> float:
        clock[0] += 1.0
        return clock[0]

    backend = DemoBackend(scenario, seed=0, cards=cards, clock=tick)
    backend.host = "demo-gpu-node"
    app = create_app(backend, interval=1.0, theme=theme, env=env or {}, sample_count=1, readonly=readonly,
                     rules=parse_rules(rules or []))
    for _ in range(HISTORY - 1):
        snapshot = app.sampler.collect()
        app.sampler.history.add(snapshot)
        app.engine.evaluate(snapshot)  # rules see the history too, so `for` durations have passed
    return app


async def wait_for_first_frame(pilot) -> None:
    while pilot.app.sampler.latest is None:
        await pilot.pause(0.05)
    await pilot.pause(0.2)
