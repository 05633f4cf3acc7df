"""The fleet overview and a host's view, driven by keys (Textual Pilot), fed by a stand-in fleet
whose hosts' news the test reports (scripts/fleet_scenes.py). The real ssh source is covered by
test_fleet_tui_ssh.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from fleet_scenes import card, machine, scene_fleet

from gpumon.fleet import Source
from gpumon.tui.fleet.app import FleetApp
from gpumon.tui.fleet.host_row import card_cell, describe_state, host_row
from gpumon.tui.fleet.host_screen import HostScreen
from gpumon.tui.fleet.host_table import RESORT_S, HostTable
from gpumon.tui.fleet.overview import FleetScreen, FleetStatusLine
from gpumon.tui.screens.run_dialog import RunDialog
from gpumon.tui.widgets.status_bar import StatusBar

NOW = 1_767_225_600.0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


def lines(table: HostTable) -> list[str]:
    """The table as the terminal shows it, line by line (header first)."""
    return [table.render_line(y).text.rstrip() for y in range(table.size.height)]


def row_of(table: HostTable, host: str) -> str:
    return next(line for line in lines(table)[1:] if line.split()[:1] == [host])


async def drawn(pilot) -> HostTable:
    """Until the overview has drawn every host reported so far (the app posts them every FRAME_S); its table."""
    for _ in range(200):
        if not pilot.app.undrawn:
            break
        await pilot.pause(0.05)
    assert not pilot.app.undrawn, "the overview never drew the hosts reported"
    await pilot.pause()
    return pilot.app.overview.table


async def overview(pilot) -> tuple[FleetScreen, HostTable]:
    await pilot.pause(0.1)
    screen = pilot.app.screen
    assert isinstance(screen, FleetScreen)
    return screen, screen.query_one(HostTable)


def a_lab():
    """Four hosts in every state an overview shows."""
    fleet = scene_fleet(["gpu01", "gpu02", "gpu03", "dgx-a", "old-box"])
    def report() -> None:
        fleet.report("gpu01", "live", snapshot=machine("gpu01", [card(0, util=95, mem_pct=90, temp=81, host="gpu01"),
                                                                  card(1, util=0, mem_pct=0, temp=35, host="gpu01")]))
        fleet.report("gpu02", "live", snapshot=machine("gpu02", [card(i, util=0, temp=30 + i, host="gpu02")
                                                                  for i in range(4)]))
        fleet.report("gpu03", "unreachable", error="connection refused", retry_at=time.time() + 20)
        fleet.report("dgx-a", "live", snapshot=machine("dgx-a", [card(0, util=50, host="dgx-a", state="lost"),
                                                                  card(1, util=40, host="dgx-a", mig=3),
                                                                  card(2, util=70, host="dgx-a", state="stale")]))
        fleet.report("old-box", "live", source="nvidia-smi", note="read through nvidia-smi; launching needs gpumon "
                     "installed there", snapshot=machine("old-box", [card(0, util=20, host="old-box")]))
    return fleet, report


# -- what a row says --

def test_a_card_reads_without_colour_utilisation_as_shade_memory_as_a_bar():
    assert (card_cell(card(0, util=0, mem_pct=0)).util, card_cell(card(0, util=0, mem_pct=0)).mem) == ("·", " ")
    assert card_cell(card(0, util=20, mem_pct=50)).util + card_cell(card(0, util=20, mem_pct=50)).mem == "░▄"
    assert card_cell(card(0, util=95, mem_pct=100)).util + card_cell(card(0, util=95, mem_pct=100)).mem == "██"
    assert card_cell(card(0, util=None, mem_pct=None)).util == "?"
    lost = card_cell(card(0, state="lost"))
    assert (lost.util + lost.mem, lost.util_tone) == ("××", "lost")
    assert card_cell(card(0, state="stale")).util + card_cell(card(0, state="stale")).mem == "~~"
    assert card_cell(card(0, mig=3)).util + card_cell(card(0, mig=3)).mem == "M3"
    assert card_cell(card(0, util=95), old=True).util_tone == "old"  # a host that is away: grey


def test_a_row_says_free_cards_hottest_card_and_why_a_host_is_away():
    fleet, _ = a_lab()
    fleet.report("gpu01", "live", snapshot=machine("gpu01", [card(0, util=95, mem_pct=90, temp=81, host="gpu01"),
                                                              card(1, util=0, mem_pct=0, temp=35, host="gpu01")]))
    row = host_row(fleet.status("gpu01"), time.time())
    assert (row.state, row.free, row.total, row.hottest, row.load) == ("live", 1, 2, (81, 0), 47.5)
    fleet.report("gpu01", "unreachable", error="connection refused", retry_at=1000.0)
    away = host_row(fleet.status("gpu01"), 988.0)
    assert (away.state, away.note, away.live) == ("unreachable", "connection refused · retry in 12s", False)
    assert all(c.util_tone == "old" for c in away.cards)  # its last reading, in grey
    fleet.report("gpu01", "stale", error="no data for 3 s")
    since = fleet.status("gpu01").since
    assert describe_state(fleet.status("gpu01"), since + 9)[0] == "stale 9s"


# -- the overview --

def test_the_overview_shows_every_host_its_state_cards_free_count_and_hottest_card():
    fleet, report = a_lab()

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            screen, table = await overview(pilot)
            # A peer of the single-host app, not a subclass with its sampler switched off.
            assert not hasattr(app, "sampler") and not hasattr(app, "main_screen")
            assert app.screen_stack[1:] == [screen]
            report()
            await drawn(pilot)
            assert lines(table)[0].split()[:6] == ["HOST", "STATE", "CARDS", "FREE", "LOAD", "HOTTEST"]
            assert row_of(table, "gpu01").split()[:6] == ["gpu01", "live", "█▇", "·", "1/2", "48%"]
            assert "81°C (0)" in row_of(table, "gpu01")
            assert "4/4" in row_of(table, "gpu02")
            away = row_of(table, "gpu03")
            assert "unreachable" in away and "connection refused · retry in" in away
            dgx = row_of(table, "dgx-a")
            assert "×× M3 ~~" in dgx  # lost, MIG with 3 slices, not responding: distinct
            assert "read through nvidia-smi" in row_of(table, "old-box")
            await pilot.pause(1.2)  # the totals line follows once a second
            status = screen.query_one(FleetStatusLine).shown[0].plain
            assert "5 hosts: 4 live, 1 unreachable" in status and "5/10 cards free" in status

    run(go())


def test_sort_by_free_cards_load_and_name_and_reverse():
    fleet = scene_fleet(["b", "c", "a", "down"])

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            _, table = await overview(pilot)
            fleet.report("b", "live", snapshot=machine("b", [card(0, util=90, host="b"), card(1, util=0, host="b")]))
            fleet.report("c", "live", snapshot=machine("c", [card(i, util=0, host="c") for i in range(3)]))
            fleet.report("a", "live", snapshot=machine("a", [card(0, util=50, host="a")]))
            await drawn(pilot)
            assert table.order == ["b", "c", "a", "down"]  # as listed
            await pilot.press("o")  # free cards, most first; hosts without a reading last
            assert (table.sort_key, table.order) == ("free", ["c", "b", "a", "down"])
            await pilot.press("o")  # load, least first
            assert (table.sort_key, table.order) == ("load", ["c", "b", "a", "down"])
            await pilot.press("O")
            assert table.order == ["a", "b", "c", "down"]
            await pilot.press("o")
            assert (table.sort_key, table.order) == ("name", ["a", "b", "c", "down"])
            await pilot.press("O")
            assert table.order == ["down", "c", "b", "a"]
            assert lines(table)[0].startswith(" HOST▼")

    run(go())


def test_a_changing_sort_value_moves_a_host_at_the_next_resort_and_the_cursor_stays_on_its_host():
    fleet = scene_fleet(["x", "y"])

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            _, table = await overview(pilot)
            fleet.report("x", "live", snapshot=machine("x", [card(0, util=0, host="x"), card(1, util=0, host="x")]))
            fleet.report("y", "live", snapshot=machine("y", [card(0, util=0, host="y")]))
            await drawn(pilot)
            await pilot.press("o")
            assert table.order == ["x", "y"] and table.selected == "x"
            fleet.report("x", "live", snapshot=machine("x", [card(0, util=99, host="x"), card(1, util=99, host="x")]))
            assert table.order == ["x", "y"]  # not re-sorted per update: rows never jump under the eye
            await pilot.pause(RESORT_S + 1.5)
            assert table.order == ["y", "x"] and table.selected == "x"

    run(go())


def test_filter_with_slash_and_escape_clears():
    fleet, report = a_lab()

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            screen, table = await overview(pilot)
            report()
            await drawn(pilot)
            await pilot.press("slash", *"gpu")
            assert table.order == ["gpu01", "gpu02", "gpu03"]
            await pilot.press("backspace", "backspace", "backspace", *"unreach")
            assert table.order == ["gpu03"]
            await pilot.press("enter")  # back to the table, the filter kept
            assert table.has_focus and table.order == ["gpu03"]
            await pilot.press("escape")
            assert len(table.order) == 5

    run(go())


def test_typing_a_prefix_jumps_and_command_keys_still_work():
    fleet = scene_fleet(["alpha", "gpu01", "gpu02", "gpu10", "ohio", "zeta"])

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            screen, table = await overview(pilot)
            await pilot.press(*"gpu1")
            assert table.selected == "gpu10"
            await pilot.pause(2.0)  # a pause starts a new prefix
            await pilot.press("z")
            assert table.selected == "zeta"
            await pilot.press("x")  # no host starts with "zx" or "x": stays
            assert table.selected == "zeta"
            await pilot.pause(2.0)
            await pilot.press("o")  # a command key when no jump is under way: sort
            assert table.sort_key == "free"
            await pilot.pause(2.0)
            await pilot.press("a", "l")
            assert table.selected == "alpha"

    run(go())


def test_enter_opens_the_hosts_own_view_and_escape_returns():
    fleet, report = a_lab()

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            _, table = await overview(pilot)
            report()
            await drawn(pilot)
            await pilot.press("enter")
            assert isinstance(app.screen, HostScreen) and app.screen.host == "gpu01"
            await pilot.pause(0.3)
            bar = app.screen.query_one(StatusBar).render().plain
            assert bar.startswith(" gpumon gpu01 ") and "driver 550.54.15" in bar
            assert len(app.screen.query("GpuPanel")) == 2
            # The host's news reaches its view.
            fleet.report("gpu01", "live", snapshot=machine("gpu01", [card(0, util=12, host="gpu01"),
                                                                      card(1, util=34, host="gpu01")], time=NOW + 1))
            await pilot.pause(0.3)
            assert [p.gpu.utilization_gpu for p in app.screen.query("GpuPanel")] == [12, 34]
            fleet.report("gpu01", "unreachable", error="connection refused", retry_at=time.time() + 9)
            await pilot.pause(0.3)
            bar = app.screen.query_one(StatusBar).render().plain
            assert "unreachable: connection refused · retry in" in bar
            assert all(p.stale for p in app.screen.query("GpuPanel"))  # its last reading: "no new data"
            await pilot.press("escape")
            assert isinstance(app.screen, FleetScreen)
            fleet.report("gpu03", "unreachable", error="connection refused")  # no countdown to redraw it
            await pilot.press("down", "down", "right")  # → opens too; a host with no reading says why
            assert app.screen.host == "gpu03"
            await pilot.pause(0.1)
            assert "connection refused" in str(app.screen.query_one("#host-away").render())
            await pilot.press("left")
            assert isinstance(app.screen, FleetScreen) and table.selected == "gpu03"

    run(go())


def test_a_host_keeps_its_selected_card_when_its_view_is_opened_again():
    fleet, report = a_lab()

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            _, table = await overview(pilot)
            report()
            await drawn(pilot)
            table.select_host("gpu02")
            await pilot.press("enter")
            await pilot.pause(0.2)
            await pilot.press("down", "down")
            assert app.screen.selected_gpu.index == 2
            await pilot.press("escape")
            table.select_host("gpu01")  # another host's view in between keeps its own choice
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert app.screen.selected_gpu.index == 0
            await pilot.press("down", "escape")
            table.select_host("gpu02")
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert app.screen.host == "gpu02" and app.screen.selected_gpu.index == 2
            await pilot.press("r")  # r acts on the card picked before, not card 0
            assert isinstance(app.screen, RunDialog) and app.screen.where.startswith("gpu02:2")
            await pilot.press("escape", "escape")
            table.select_host("gpu01")
            await pilot.press("enter")
            await pilot.pause(0.2)
            assert app.screen.selected_gpu.index == 1

    run(go())


def test_with_every_host_away_the_header_counts_the_cards_the_rows_show_and_says_they_are_old():
    fleet, report = a_lab()

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(160, 40)) as pilot:
            screen, table = await overview(pilot)
            report()
            await drawn(pilot)
            fleet.report("gpu01", "unreachable", error="connection refused")
            await drawn(pilot)
            await pilot.pause(1.2)  # the totals line follows once a second
            status = screen.query_one(FleetStatusLine).shown[0].plain
            assert "5/10 cards free (2 from old readings)" in status
            for host in ("gpu02", "dgx-a", "old-box"):
                fleet.report(host, "unreachable", error="connection refused")
            await drawn(pilot)
            await pilot.pause(1.2)
            status = screen.query_one(FleetStatusLine).shown[0].plain
            assert "5/10 cards free (all from old readings)" in status
            assert "1/2" in row_of(table, "gpu01").split()  # the rows keep the same readings

    run(go())


def test_m_in_a_hosts_view_sets_that_cards_default_limit_named_host_and_card():
    from gpumon.jobs.launch import card_limits
    from gpumon.tui.screens.run_dialog import MemLimitDialog

    fleet, report = a_lab()

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            await overview(pilot)
            report()
            await drawn(pilot)
            await pilot.press("enter")
            await pilot.pause(0.3)
            await pilot.press("j", "m")  # the second card of gpu01
            assert isinstance(app.screen, MemLimitDialog) and app.screen.where == "gpu01:1"
            await pilot.press("2", "G", "enter")
            await pilot.pause(0.1)
            uuid = app.screen.snapshot.gpus[1].uuid
            assert card_limits().get(uuid) == 2 * 1024**3
            assert any("gpu01:1: jobs launched here are capped at 2.0G" in str(n.message)
                       for n in app._notifications)

    run(go())


def test_r_opens_the_run_dialog_for_the_hosts_freest_card_and_says_why_not_on_an_nvidia_smi_host():
    fleet, report = a_lab()

    async def go():
        app = FleetApp(fleet)
        said: list[str] = []
        notify = app.notify
        app.notify = lambda message, **kw: said.append(str(message)) or notify(message, **kw)
        async with app.run_test(size=(120, 40)) as pilot:
            _, table = await overview(pilot)
            report()
            await drawn(pilot)
            await pilot.press("r")
            assert isinstance(app.screen, RunDialog)
            assert app.screen.where.startswith("gpu01:1")  # card 0 is busy
            assert app.screen.remote and app.screen.query_one("#run-cwd").value == ""
            await pilot.press("escape")
            table.select_host("old-box")
            await pilot.press("r")
            assert not isinstance(app.screen, RunDialog)
            assert "old-box is read through nvidia-smi: launching needs gpumon installed there" in said
            await pilot.press("R")  # the best free card anywhere
            assert isinstance(app.screen, RunDialog) and app.screen.where.split(" ")[0] in ("gpu02:0", "gpu01:1")

    run(go())


def test_readonly_offers_no_launching_on_the_overview():
    fleet, report = a_lab()

    async def go():
        app = FleetApp(fleet, readonly=True)
        async with app.run_test(size=(120, 40)) as pilot:
            await overview(pilot)
            report()
            await drawn(pilot)
            await pilot.press("r", "R")
            assert isinstance(app.screen, FleetScreen)
            await pilot.press("enter", "r")
            assert isinstance(app.screen, HostScreen)

    run(go())


# -- cost at 256 hosts --

def test_256_hosts_render_only_the_visible_rows_and_repaint_only_the_host_that_changed():
    names = [f"node{i:03d}" for i in range(256)]
    fleet = scene_fleet(names)

    def report_all(util: int) -> None:
        for i, name in enumerate(names):
            fleet.report(name, "live", snapshot=machine(name, [card(c, util=(util + i + c) % 100, host=name)
                                                               for c in range(8)]))

    async def go():
        app = FleetApp(fleet)
        async with app.run_test(size=(120, 40)) as pilot:
            _, table = await overview(pilot)
            report_all(0)
            await drawn(pilot)
            rendered: list[int] = []
            built: list[str] = []
            render_line, row_strip = table.render_line, table._row_strip
            table.render_line = lambda y: rendered.append(y) or render_line(y)
            table._row_strip = lambda index, width: built.append(table.order[index]) or row_strip(index, width)
            visible = table.size.height - 1
            assert 30 <= visible < 40

            report_all(7)  # every host changes
            await drawn(pilot)
            assert 0 < len(rendered) <= table.size.height  # the lines on screen, not 257
            assert set(built) <= set(names[:visible])  # rows of hosts off screen: never drawn

            rendered.clear()
            built.clear()
            fleet.report("node200", "live", snapshot=machine("node200", [card(c, util=1, host="x") for c in range(8)]))
            await drawn(pilot)
            assert rendered == [] and built == []  # off screen: nothing to draw

            fleet.report("node003", "live", snapshot=machine("node003", [card(c, util=1, host="x") for c in range(8)]))
            await drawn(pilot)
            assert rendered == [4] and built == ["node003"]  # one host changed: its line alone

            await pilot.press("end")  # keys answer, and scrolling draws the rows that come into view
            await pilot.pause(0.3)
            assert table.selected == "node255" and "node255" in built
            await pilot.press("pageup", "up")
            assert table.selected == f"node{255 - (table.size.height - 2) - 1:03d}"
            await pilot.press("home")
            await pilot.click(table, offset=(5, 2))  # the header, node000, then node001
            assert table.selected == "node001"

    run(go())


def test_a_single_machine_start_never_imports_the_fleet_and_hosts_start_the_overview(tmp_path):
    """`gpumon` without hosts: no fleet module loaded (start-up does not grow); with --hosts, or the
    config's [fleet] hosts, the fleet TUI starts instead (unless --demo asks for this machine)."""
    config = tmp_path / "config.toml"
    config.write_text('[fleet]\nhosts = ["local"]\n')
    code = """if True:
        import sys, types
        # The fleet TUI's module is replaced before anything can import it: the single-machine
        # start must get by without it, and the fleet start only has to reach it.
        fake = types.ModuleType("gpumon.tui.fleet.app")
        fake.run_fleet_app = lambda args, fleet, **k: print("fleet", list(fleet.names),
                                                            [s.kind for s in fleet.sources]) or 0
        sys.modules["gpumon.tui.fleet.app"] = fake
        import gpumon.tui.app
        gpumon.tui.app.run_app = lambda *a, **k: print("single", sorted(
            m for m in sys.modules if "fleet" in m and m != "gpumon.tui.fleet.app")) or 0
        from gpumon.cli import main
        sys.exit(main(sys.argv[1:]))
    """
    def gpumon(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert gpumon("--demo") == "single []"
    assert gpumon("--demo", "--hosts", "local,gpu[01-02]") == (
        "fleet ['local', 'gpu01', 'gpu02'] ['local', 'gpumon', 'gpumon']")
    assert gpumon("--config", str(config)) == "fleet ['local'] ['local']"
    assert gpumon("--config", str(config), "--demo") == "single []"  # --demo: this machine alone
    cluster = tmp_path / "cluster.toml"  # a cluster read through its Prometheus, by default
    cluster.write_text('[fleet]\nprometheus_url = "http://127.0.0.1:9"\n')
    assert gpumon("--config", str(cluster)) == "fleet [] ['prometheus']"
    assert gpumon("--config", str(cluster), "--hosts", "gpu01") == "fleet ['gpu01'] ['gpumon']"


@pytest.mark.parametrize("argv, message", [
    (["--hosts=-oProxyCommand=x"], "-oProxyCommand"),
    (["--hosts", "local", "--replay", "x.jsonl"], "--replay"),
])
def test_bad_host_options_are_one_line_and_status_2(argv, message):
    done = subprocess.run([sys.executable, "-m", "gpumon", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1


def test_hosts_a_source_finds_later_join_the_overview_and_cannot_launch():
    """A Prometheus source finds a cluster's nodes as it reads them: they join the overview (after
    the hosts listed), and `r` says why nothing can be launched there."""
    fleet = scene_fleet(["gpu01"])

    class Finder(Source):
        kind, hosts = "prometheus", ()

        async def run(self, fleet):
            await asyncio.Event().wait()

    finder = Finder()
    fleet.sources.append(finder)

    async def go():
        app = FleetApp(fleet)
        said: list[str] = []
        notify = app.notify
        app.notify = lambda message, **kw: said.append(str(message)) or notify(message, **kw)
        async with app.run_test(size=(120, 40)) as pilot:
            screen, table = await overview(pilot)
            fleet.report("gpu01", "live", snapshot=machine("gpu01", [card(0, host="gpu01")]))
            for name in ("node-a", "node-b"):
                assert fleet.add_host(name, finder)
                fleet.report(name, "live", source="prometheus",
                             snapshot=machine(name, [card(0, util=30, host=name), card(1, host=name)]))
            await pilot.pause(1.5)  # the next tick shows them
            shown = [line.split()[0] for line in lines(table)[1:] if line.strip()]
            assert shown[:3] == ["gpu01", "node-a", "node-b"]
            assert "1/2" in row_of(table, "node-b").split()  # free cards (card 0 is busy), as select counts them
            table.select_host("node-a")
            await pilot.press("r")
            assert not isinstance(app.screen, RunDialog)
            assert any("node-a is read through Prometheus" in s for s in said)

    run(go())
