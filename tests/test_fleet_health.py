"""The fleet overview's HEALTH column: per host the worst verdict of its cards and how many cards
have it, filterable with `/` and sortable with `o`; driven through the real app (Textual Pilot) fed
by a stand-in fleet (scripts/fleet_scenes.py)."""

from __future__ import annotations

import time

from fleet_scenes import card, machine, scene_fleet
from test_fleet_tui import drawn, lines, row_of, run

from gpumon.tui.fleet.app import FleetApp
from gpumon.tui.fleet.host_row import host_row


def a_ward():
    """A host with a failing card, one with two warning cards, a healthy one, one read through
    nvidia-smi (no verdicts), and one away whose last reading had a failing card."""
    fleet = scene_fleet(["sick", "shaky", "fine", "smi", "gone"])

    def report() -> None:
        fleet.report("sick", "live", snapshot=machine("sick", [
            card(0, host="sick", health="ok"), card(1, host="sick", health="fail"),
            card(2, host="sick", health="warn")]))
        fleet.report("shaky", "live", snapshot=machine("shaky", [card(i, host="shaky", health=("warn", "warn", "ok")[i])
                                                                  for i in range(3)]))
        fleet.report("fine", "live", snapshot=machine("fine", [card(i, host="fine", health="ok") for i in range(2)]))
        fleet.report("smi", "live", source="nvidia-smi", snapshot=machine("smi", [card(0, host="smi")]))
        fleet.report("gone", "live", snapshot=machine("gone", [card(0, host="gone", health="fail")]))
        fleet.report("gone", "unreachable", error="connection refused", retry_at=time.time() + 30)
    return fleet, report


def test_a_row_says_the_worst_verdict_and_how_many_cards_have_it():
    fleet, report = a_ward()
    report()
    now = time.time()
    rows = {name: host_row(fleet.status(name), now) for name in ("sick", "shaky", "fine", "smi", "gone")}
    assert (rows["sick"].health, rows["sick"].health_tone) == ("FAIL 1", "bad")  # a fail outweighs a warning
    assert (rows["shaky"].health, rows["shaky"].health_tone) == ("WARN 2", "caution")
    assert (rows["fine"].health, rows["fine"].health_tone) == ("ok", "muted")  # nothing alarming
    assert rows["smi"].health == "" and rows["smi"].health_rank is None  # no verdicts: blank, not "ok"
    assert (rows["gone"].health, rows["gone"].health_tone) == ("FAIL 1", "muted")  # an old reading: grey
    assert rows["sick"].matches("fail") and rows["sick"].matches("remap_pending")
    assert not rows["fine"].matches("fail") and rows["shaky"].matches("pcie_replays")


def test_the_overview_shows_health_filters_and_sorts_by_it():
    fleet, report = a_ward()

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause(0.1)
            report()
            table = await drawn(pilot)
            assert lines(table)[0].split()[:4] == ["HOST", "STATE", "HEALTH", "CARDS"]
            assert row_of(table, "sick").split()[:4] == ["sick", "live", "FAIL", "1"]
            assert row_of(table, "shaky").split()[:4] == ["shaky", "live", "WARN", "2"]
            assert row_of(table, "fine").split()[:3] == ["fine", "live", "ok"]
            smi = row_of(table, "smi")
            assert smi.split()[:2] == ["smi", "live"] and "ok" not in smi.split() and "FAIL" not in smi
            # Coloured as the cards' panels: FAIL in the error colour, WARN in the warning colour, both bold.
            bad, caution = table._style("bad"), table._style("caution")
            assert bad.bold and caution.bold and bad.color != caution.color

            await pilot.press("slash", *"fail")
            assert table.order == ["sick", "gone"]
            await pilot.press("escape")
            await pilot.press("slash", *"pcie")
            assert table.order == ["sick", "shaky"]
            await pilot.press("escape")
            assert len(table.order) == 5

            for _ in range(4):  # free, load, name, health
                await pilot.press("o")
            assert table.sort_key == "health"
            assert table.order == ["sick", "gone", "shaky", "fine", "smi"]  # worst first, no verdict last
            assert "HEALTH▲" in lines(table)[0]

            # The worst card gets better: the host moves at the next re-sort, the row says so at once.
            fleet.report("sick", "live",
                         snapshot=machine("sick", [card(i, host="sick", health="ok") for i in range(3)]))
            table = await drawn(pilot)
            assert row_of(table, "sick").split()[:3] == ["sick", "live", "ok"]
            table.reorder()
            assert table.order == ["gone", "shaky", "sick", "fine", "smi"]

    run(go())


def test_at_80_columns_health_stays_on_screen_and_the_end_of_a_line_is_cut():
    fleet, report = a_ward()

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause(0.1)
            report()
            table = await drawn(pilot)
            shown = lines(table)
            assert all(len(line) <= 80 for line in shown)
            assert "HEALTH" in shown[0]
            assert "FAIL 1" in row_of(table, "sick") and "WARN 2" in row_of(table, "shaky")

    run(go())


def test_a_fleet_without_verdicts_has_no_health_column():
    fleet = scene_fleet(["a", "b"])

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 30)) as pilot:
            await pilot.pause(0.1)
            fleet.report("a", "live", source="nvidia-smi", snapshot=machine("a", [card(0, host="a")]))
            fleet.report("b", "live", snapshot=machine("b", [card(0, host="b")]))
            table = await drawn(pilot)
            assert "HEALTH" not in lines(table)[0] and table.health_width == 0
            fleet.report("b", "live", snapshot=machine("b", [card(0, host="b", health="warn")]))
            table = await drawn(pilot)
            assert lines(table)[0].split()[:3] == ["HOST", "STATE", "HEALTH"]
            assert row_of(table, "b").split()[:4] == ["b", "live", "WARN", "1"]

    run(go())
