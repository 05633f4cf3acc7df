"""Topology: `gpumon topo` against an 8-card, 2-socket fake driver, placement, and the TUI view."""

from __future__ import annotations

import asyncio
import json

from conftest import GIB, Card

from gpumon.cards.backends.demo import DemoBackend
from gpumon.cards.topology import best_partners, link_rank
from gpumon.jobs.placement import choose
from gpumon.tui.app import create_app
from gpumon.tui.screens.topology import TopologyScreen


def eight_cards(machine, busy: set[int] = frozenset()) -> list[list[str]]:
    """Two sockets of four cards; NVLink pairs (0,1) (2,3) (4,5) (6,7); PCIe switches in pairs.

    Returns the matrix nvidia-smi would print for it.
    """
    machine.cards = [
        Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB,
             extra=dict(cpus="0-15,64-79" if i < 4 else "16-31,80-95", numa=0 if i < 4 else 1,
                        util=95 if i in busy else 1, mem_used=70 * GIB if i in busy else GIB))
        for i in range(8)
    ]
    machine.topo_default = 50
    expected = [["X" if i == j else "" for j in range(8)] for i in range(8)]
    for i in range(8):
        for j in range(8):
            if i == j:
                continue
            if i // 4 != j // 4:
                level, word = 50, "SYS"
            elif i // 2 == j // 2:
                level, word = 10, "PIX"
            else:
                level, word = 40, "NODE"
            if i < j:
                machine.links.append((i, j, level))
            expected[i][j] = word
    for a in (0, 2, 4, 6):
        machine.nvlinks.append((a, a + 1, 18 if a < 4 else 6))
        expected[a][a + 1] = expected[a + 1][a] = "NV18" if a < 4 else "NV6"
    return expected


def test_topo_prints_the_drivers_matrix_cell_for_cell(fake_driver):
    expected = eight_cards(fake_driver.machine)
    fake_driver.write()
    out = fake_driver.run("topo")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == [f"GPU{i}" for i in range(8)] + ["CPU", "Affinity", "NUMA", "Affinity"]
    for i in range(8):
        cells = lines[1 + i].split()
        assert cells[0] == f"GPU{i}"
        assert cells[1:9] == expected[i], f"row {i}"
        assert cells[9] == ("0-15,64-79" if i < 4 else "16-31,80-95")
        assert cells[10] == ("0" if i < 4 else "1")
    assert "Legend:" in out.stdout and "NV#" in out.stdout

    doc = json.loads(fake_driver.run("topo", "--json").stdout)
    for i, gpu in enumerate(doc["gpus"]):
        assert [gpu["links"][str(j)] for j in range(8)] == expected[i]
        assert gpu["numa_node"] == (0 if i < 4 else 1)
    assert doc["gpus"][0]["nvlinks"] == {"1": 18}


def test_select_picks_an_nvlink_connected_free_pair(fake_driver):
    # Cards 0 and 2 are busy, so the NVLink pairs left whole are (4,5) and (6,7): one of them,
    # never a split pair like (1,3).
    eight_cards(fake_driver.machine, busy={0, 2})
    fake_driver.write()
    snap = json.loads(fake_driver.run("snapshot", "--json").stdout)
    uuid = {g["index"]: g["uuid"] for g in snap["gpus"]}
    out = fake_driver.run("select", "--count", "2", "--min-free", "20G", "--verbose")
    assert out.returncode == 0, out.stderr
    chosen = out.stdout.strip().split(",")
    pairs = [{uuid[4], uuid[5]}, {uuid[6], uuid[7]}]
    assert set(chosen) in pairs
    assert "NVLinks" in out.stderr and "GPU 0 skipped" in out.stderr


def test_select_prefers_the_better_nvlink_pair(fake_driver):
    eight_cards(fake_driver.machine, busy={0})
    fake_driver.write()
    snap = json.loads(fake_driver.run("snapshot", "--json").stdout)
    uuid = {g["index"]: g["uuid"] for g in snap["gpus"]}
    out = fake_driver.run("select", "--count", "2", "--min-free", "20G")
    assert set(out.stdout.strip().split(",")) == {uuid[2], uuid[3]}  # the intact 18-link pair


def test_select_with_too_few_free_cards_exits_1(fake_driver):
    eight_cards(fake_driver.machine, busy=set(range(8)))
    fake_driver.write()
    out = fake_driver.run("select", "--min-free", "20G")
    assert out.returncode == 1 and "0 of 8 cards are free" in out.stderr and out.stdout == ""


def test_link_ranking_order():
    order = ["NV18", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS", None]
    assert sorted(order, key=link_rank) == order


def test_best_partners_and_choose_on_the_demo():
    backend = DemoBackend(cards=8)
    topo = backend.topology()
    assert [o for o, _ in best_partners(topo, 4)][:3] == [5, 6, 7]
    snap = backend.sample()
    choice = choose(snap, 4, topo, max_util=100, max_used="100%")  # links only: busy cards allowed
    # Card 3 and 7 are idle in the demo; any 4 on one socket beat a cross-socket set.
    indices = [g.index for g in choice.gpus]
    assert len({i // 4 for i in indices}) == 1


def test_choose_many_cards_falls_back_to_greedy():
    backend = DemoBackend(cards=16)
    choice = choose(backend.sample(), 8, backend.topology(), max_util=100, max_used="100%")
    assert len(choice.gpus) == 8


def test_topology_view_in_the_tui():
    async def go():
        app = create_app(DemoBackend(cards=8), interval=0.1)
        async with app.run_test(size=(80, 24)) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.press("j", "t")
            await pilot.pause(0.3)
            assert isinstance(app.screen, TopologyScreen)
            assert app.screen.selected == 1
            partners = app.screen.query_one("#topo-partners").render()
            assert "GPU 0 (12 NVLinks)" in str(partners)
            await pilot.press("down")
            assert app.screen.selected == 2
            await pilot.press("escape")
            assert not isinstance(app.screen, TopologyScreen)

    asyncio.run(go())
