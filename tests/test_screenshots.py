"""The main layouts, pinned (pytest-textual-snapshot), and screenshots/ kept up to date."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from showcase import SHOTS, demo_app, showcase_state, wait_for_first_frame

ROOT = Path(__file__).resolve().parent.parent

PINNED = ["main-200x60.svg", "main-80x24.svg", "filter-120x40.svg", "help-120x40.svg", "light-120x40.svg",
          "fleet-120x40.svg"]


@pytest.mark.parametrize("name", PINNED)
def test_layout_snapshot(snap_compare, name):
    _, options, size, keys = next(shot for shot in SHOTS if shot[0] == name)
    assert snap_compare(demo_app(**options), terminal_size=size, press=keys, run_before=wait_for_first_frame)


def test_screenshots_folder_matches_the_current_ui(tmp_path):
    from screenshots import render

    async def render_all():
        stale = []
        for name, options, size, keys in SHOTS:
            fresh = await render(name, options, size, keys, tmp_path)
            committed = ROOT / "screenshots" / name
            if not committed.exists() or committed.read_bytes() != fresh.read_bytes():
                stale.append(name)
        return stale

    with showcase_state():
        stale = asyncio.run(render_all())
    assert not stale, f"screenshots out of date (run scripts/screenshots.py): {stale}"
