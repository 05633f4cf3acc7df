"""The TUI driven by keys (Textual Pilot), on the demo backend and on the fake driver."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import GIB, Card
from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.cards.backends.demo import DemoBackend
from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.tui.app import create_app
from gpumon.tui.screens.confirm import ConfirmScreen
from gpumon.tui.screens.environment import EnvironmentScreen
from gpumon.tui.screens.help import HelpScreen
from gpumon.tui.widgets.card_list import CardList
from gpumon.tui.widgets.gpu_panel import GpuPanel
from gpumon.tui.widgets.process_table import ProcessTable


def run(coro):
    return asyncio.run(coro)


async def started(pilot):
    """The main screen once the first snapshot is on it and the layout has settled."""
    while pilot.app.sampler.latest is None:
        await pilot.pause(0.05)
    await pilot.pause(0.3)
    return pilot.app.main_screen


def table_pids(screen) -> list[int]:
    table = screen.query_one(ProcessTable)
    return [int(table.cell_text(i, "pid")) for i in range(table.row_count)]


def test_keys_select_cards_and_scope_the_process_table():
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            cards = screen.query_one(CardList)
            assert cards.selected == 0 and len(cards.panels) == 4
            await pilot.press("j", "j")
            assert cards.selected == 2
            assert cards.panels[2].selected and not cards.panels[0].selected
            await pilot.press("k")
            assert cards.selected == 1
            await pilot.press("down")
            await pilot.press("a")  # only the selected card's processes
            await pilot.pause(0.3)
            table = screen.query_one(ProcessTable)
            gpus = {int(table.cell_text(i, "gpu")) for i in range(table.row_count)}
            assert gpus == {2} and table.row_count == 2
            assert "GPU 2" in screen.table_frame.border_title
            await pilot.press("a")
            await pilot.pause(0.3)
            assert table.row_count == 4

    run(go())


def test_once_the_first_sample_is_up_the_collector_no_longer_walks_what_the_start_built():
    """A full garbage collection walked every widget, style and module object the start made (~25 ms
    here, about every 30 s: 7 % of the TUI's CPU); once the first sample is drawn they are
    frozen (gc.freeze), and what is made after that is collected as before."""
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            table = screen.query_one(ProcessTable)
            assert gc.get_freeze_count() > 10_000
            assert not any(o is table for o in gc.get_objects())  # frozen: in no generation the collector walks

    assert gc.get_freeze_count() == 0  # (conftest unfreezes after every test)
    run(go())


def test_click_selects_a_card():
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            await pilot.click("#gpu-3")
            assert screen.query_one(CardList).selected == 3

    run(go())


def test_moving_the_selection_marks_the_card_without_a_layout_pass(monkeypatch):
    """↑/↓ repaint two panels: restyling them through CSS classes laid the whole screen out again,
    which was most of the time a key took to show."""
    from textual.screen import Screen

    layouts = []
    refresh_layout = Screen._refresh_layout
    monkeypatch.setattr(Screen, "_refresh_layout", lambda self, *a, **k: (layouts.append(1),
                                                                           refresh_layout(self, *a, **k))[1])

    def first_column(screen, panel) -> list[str]:
        region, strips = panel.region, screen._compositor.render_strips()
        return [strips[y].text[region.x] for y in range(region.y, region.bottom)]

    async def go():
        async with create_app(DemoBackend(), interval=10).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            panels = screen.query_one(CardList).panels
            assert set(first_column(screen, panels[0])) == {"▌"}
            for _ in range(50):  # until the start's own layout passes are over (later on a slow machine)
                layouts.clear()
                await pilot.pause(0.1)
                if not layouts:
                    break
            assert layouts == [], "the screen never settled"
            await pilot.press("j")
            await pilot.pause(0.1)
            assert set(first_column(screen, panels[1])) == {"▌"} and set(first_column(screen, panels[0])) == {" "}
            assert layouts == []

    run(go())


def test_sort_cycles_and_orders_rows():
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            table = screen.query_one(ProcessTable)
            assert table.sort_key == "gpu_mem"
            mems = [table.rows_by_key[k].process.gpu_memory for k in table.order]
            assert mems == sorted(mems, reverse=True)
            await pilot.press("tab")
            for expected in ("sm", "cpu", "pid"):
                await pilot.press("s")
                assert table.sort_key == expected
            await pilot.pause(0.3)
            assert table.header_label("pid") == "PID▲"
            assert table_pids(screen) == sorted(table_pids(screen))
            await pilot.press("S")
            await pilot.pause(0.3)
            assert table_pids(screen) == sorted(table_pids(screen), reverse=True)

    run(go())


def test_filter_by_text_and_escape_clears():
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            await pilot.press("slash", *"vllm")
            await pilot.pause(0.3)
            assert table_pids(screen) == [52904]
            assert "vllm" in screen.table_frame.border_title
            await pilot.press("escape")
            await pilot.pause(0.3)
            assert len(table_pids(screen)) == 4

    run(go())


def test_help_lists_every_key_and_closes():
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("question_mark")
            assert isinstance(pilot.app.screen, HelpScreen)
            from gpumon.tui.screens.help import KEYS
            described = {key for _, keys in KEYS for key, _ in keys}
            for binding_key in ("j k", "a", "/", "x", "X", "i", "e", "q", "?", "w", "c"):
                assert any(binding_key in k for k in described), binding_key
            await pilot.press("escape")
            assert not isinstance(pilot.app.screen, HelpScreen)
            # Built once and kept: it opens again, and closes again, as often as asked.
            for _ in range(2):
                await pilot.press("question_mark")
                assert isinstance(pilot.app.screen, HelpScreen)
                await pilot.press("q")
                assert not isinstance(pilot.app.screen, HelpScreen)
            assert pilot.app.is_running

    run(go())


def test_theme_key_cycles_and_no_color_is_monochrome(monkeypatch):
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(80, 24)) as pilot:
            await started(pilot)
            assert pilot.app.theme == "gpumon-dark"
            await pilot.press("c")
            assert pilot.app.theme != "gpumon-dark"
        monkeypatch.setenv("NO_COLOR", "1")
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(80, 24)) as pilot:
            await started(pilot)
            assert pilot.app.theme == "monochrome"

    run(go())


def test_a_new_theme_reaches_the_panels_and_the_status_line():
    """Panels and the status line keep their component styles between samples: a theme change must
    still reach them (the styles they draw with are the new theme's)."""
    from gpumon.tui.widgets.status_bar import StatusBar

    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            panel, bar = screen.query(GpuPanel).first(), screen.query_one(StatusBar)
            before = (panel._style("title"), bar._style("muted"))
            await pilot.press("c")
            await pilot.pause(0.3)
            after = (panel._style("title"), bar._style("muted"))
            assert after != before
            assert after == (panel.get_component_rich_style("gpu-panel--title"),
                             bar.get_component_rich_style("status-bar--muted"))

    run(go())


def test_broken_user_theme_is_a_notification_not_a_crash(tmp_path):
    theme_dir = tmp_path / "config" / "gpumon" / "themes"
    theme_dir.mkdir(parents=True)
    (theme_dir / "broken.toml").write_text("name = 'x'\nprimary = \n")
    (theme_dir / "mine.toml").write_text("name = 'mine'\nprimary = '#ff0000'\n")
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path / "config")

    async def go():
        app = create_app(DemoBackend(), interval=0.1, theme="mine")
        async with app.run_test(size=(80, 24)) as pilot:
            await started(pilot)
            assert app.theme == "mine"
            assert any("broken.toml" in p for p in app.theme_problems)

    run(go())


@pytest.mark.parametrize(("size", "compact"), [((80, 24), True), ((120, 40), False), ((200, 60), False)])
def test_layout_fits_the_terminal(size, compact):
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=size) as pilot:
            screen = await started(pilot)
            panels = screen.query(GpuPanel)
            assert all(p.compact == compact for p in panels)
            assert screen.query_one("#charts").display == (size[0] >= 140)
            table = screen.query_one(ProcessTable)
            assert table.size.height >= 6, "the process table keeps room"

    run(go())


def test_sixteen_cards_and_resizing_never_crash():
    async def go():
        async with create_app(DemoBackend(cards=16), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            assert len(screen.query(GpuPanel)) == 16
            for size in [(80, 24), (200, 60), (60, 15), (250, 70), (120, 40)]:
                await pilot.resize_terminal(*size)
                await pilot.pause(0.2)
            await pilot.press("end")
            assert screen.query_one(CardList).selected == 15
            assert screen.query_one(ProcessTable).size.height >= 4

    run(go())


def test_keys_are_answered_while_a_sample_is_in_flight():
    release = threading.Event()
    blocked = threading.Event()  # a driver call is under way …
    returned = threading.Event()  # … and has not come back

    class SlowDemo(DemoBackend):
        def sample(self):
            if self.step >= 1:
                blocked.set()
                release.wait(10)
                returned.set()
            return super().sample()

    async def go():
        async with create_app(SlowDemo(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            while not blocked.is_set():
                await pilot.pause(0.02)
            await pilot.press("j")
            await pilot.press("question_mark")
            # Both keys took effect while the driver call was still blocked.
            assert not returned.is_set()
            assert screen.query_one(CardList).selected == 1
            assert isinstance(pilot.app.screen, HelpScreen)
            release.set()

    run(go())


def test_stale_data_is_marked():
    release = threading.Event()

    class SlowDemo(DemoBackend):
        def sample(self):
            if self.step >= 1:
                release.wait(10)
            return super().sample()

    async def go():
        async with create_app(SlowDemo(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            await pilot.pause(0.5)
            panel = screen.query_one(CardList).panels[0]
            assert panel.stale
            assert "no new data" in "".join(line.plain for line in panel.lines(100))
            release.set()

    run(go())


def test_demo_and_readonly_offer_no_process_actions():
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            assert screen.check_action("signal", ("kill",)) is False
            await pilot.press("tab", "X")
            assert not isinstance(pilot.app.screen, ConfirmScreen)

    run(go())


@pytest.fixture
def nvml_app(fake_driver):
    """An app on the fake driver with one real child process on card 1."""

    def make(readonly=False, env=None):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 env=dict(os.environ, CUDA_VISIBLE_DEVICES="GPU-test-1", MARKER="yes"))
        make.children.append(child)
        fake_driver.machine.cards = [Card("NVIDIA A10"), Card("NVIDIA A10")]
        fake_driver.machine.procs = [dict(gpu=1, pid=child.pid, mem=2 * GIB, sm=50)]
        fake_driver.write()
        backend = NvmlBackend(lib_path=str(fake_driver.lib))
        make.backends.append(backend)
        return create_app(backend, interval=0.2, readonly=readonly, env=env), child

    make.children, make.backends = [], []
    yield make
    for child in make.children:
        child.kill()
        child.wait()
    for backend in make.backends:
        backend.close()


def test_terminate_a_real_process_after_confirming(nvml_app):
    app, child = nvml_app()

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            await pilot.press("tab")
            assert screen.query_one(ProcessTable).selected_row.process.pid == child.pid
            await pilot.press("x")
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("n")  # declined: nothing happens
            await pilot.pause(0.2)
            assert child.poll() is None
            await pilot.press("x")
            await pilot.press("y")
            await pilot.pause(0.2)

    run(go())
    assert child.wait(5) == -signal.SIGTERM


def test_signalling_an_exited_process_is_shown_not_raised(nvml_app):
    app, child = nvml_app()
    notes = []

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            app.notify = lambda message, **kw: notes.append(message)  # collect what the user is told
            await pilot.press("tab", "X")
            assert isinstance(app.screen, ConfirmScreen)
            child.kill()  # exits while the user reads the question
            child.wait()
            await pilot.press("y")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, ConfirmScreen)

    run(go())
    assert any("already exited" in n for n in notes), notes


def test_readonly_turns_actions_off(nvml_app):
    app, child = nvml_app(readonly=True)

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            assert screen.check_action("signal", ("terminate",)) is False
            await pilot.press("tab", "x")
            assert not isinstance(app.screen, ConfirmScreen)

    run(go())
    assert child.poll() is None


def test_environment_of_a_process_shows_cuda_variables(nvml_app):
    app, child = nvml_app()

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("tab", "e")
            assert isinstance(app.screen, EnvironmentScreen)
            assert app.screen.env["CUDA_VISIBLE_DEVICES"] == "GPU-test-1"
            assert app.screen.env["MARKER"] == "yes"

    run(go())


def test_cuda_ordinal_shown_from_the_environment(nvml_app):
    app, _ = nvml_app(env={"CUDA_VISIBLE_DEVICES": "1"})

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            panels = screen.query_one(CardList).panels
            assert panels[0].ordinal == "hidden" and panels[1].ordinal == "0"
            assert "CUDA hidden" in panels[0].lines(110)[0].plain

    run(go())


def test_lost_card_says_lost_while_others_update(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(util="0..100")), Card(extra=dict(lost_after=0.5))]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        async with create_app(backend, interval=0.2).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            await pilot.pause(1.0)
            panels = screen.query_one(CardList).panels
            assert "LOST" in "".join(line.plain for line in panels[1].lines(110))
            before = panels[0].gpu
            await pilot.pause(0.6)
            assert panels[0].gpu.utilization_gpu != before.utilization_gpu or panels[0].gpu is not before

    run(go())


def test_quit_key_exits_with_status_0():
    async def go():
        app = create_app(DemoBackend(), interval=0.1)
        async with app.run_test(size=(80, 24)) as pilot:
            await started(pilot)
            await pilot.press("q")
        return app.return_value

    assert run(go()) == 0


def test_fast_start_imports_nothing_heavy_for_snapshot():
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpumon", "--version"], check=True, capture_output=True)
    assert time.perf_counter() - t0 < 30  # sanity only; start-up cost is measured by benchmarks/


def test_alert_badges_on_cards_and_the_alerts_list():
    from gpumon.alerting.rules import parse_rules
    from gpumon.tui.screens.alerts import AlertsScreen

    async def go():
        app = create_app(DemoBackend("hot"), interval=0.1, rules=parse_rules(["temp > 85", "util > 99"]))
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            while 0 not in app.engine.firing():
                await pilot.pause(0.1)
            await pilot.pause(0.2)
            panels = screen.query_one(CardList).panels
            assert "⚠ temp > 85" in panels[0].lines(110)[0].plain
            assert "⚠" not in panels[1].lines(110)[0].plain
            assert "ALERT" in screen.query_one("#status").render().plain
            await pilot.press("exclamation_mark")
            assert isinstance(app.screen, AlertsScreen)
            assert any(e.event == "firing" and e.gpu == 0 for e in app.alert_log)

    run(go())


def test_replay_pause_step_and_speed(tmp_path):
    from gpumon.cards.backends.replay import ReplayBackend
    from gpumon.cards.recording import Recorder

    recording = tmp_path / "rec.jsonl"
    recorder, demo = Recorder(str(recording)), DemoBackend()
    for _ in range(50):
        recorder.write(demo.sample())
    recorder.close()

    async def go():
        app = create_app(ReplayBackend(str(recording)), interval=0.1)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            replay = app.sampler.backend
            await pilot.press("space")
            paused_at = replay.position
            await pilot.pause(0.5)
            assert replay.position == paused_at
            await pilot.press("full_stop")
            await pilot.pause(0.4)
            assert replay.position == paused_at + 1
            await pilot.press("plus")
            assert app.sampler.interval == pytest.approx(0.05)
            assert "×2" in app.replay_status() and "PAUSED" in app.replay_status()
            await pilot.press("space")
            await pilot.pause(0.5)
            assert replay.position > paused_at + 2

    run(go())


def test_replay_keys_are_not_offered_live():
    async def go():
        app = create_app(DemoBackend(), interval=0.1)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            assert app.check_action("replay_pause", ()) is False

    run(go())


@pytest.fixture
def launch_app(fake_driver):
    """An app on three fake A10s that can launch jobs; its backend is closed after the test."""
    fake_driver.machine.cards = [Card("NVIDIA A10", uuid=f"GPU-a10a10a{i}-0000-1111-2222-333344445555",
                                      mem_total=24 * GIB, extra=dict(cpus="0-1")) for i in range(3)]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    yield create_app(backend, interval=0.2, backend_args={"nvml_lib": str(fake_driver.lib)})
    backend.close()


def test_r_launches_on_the_selected_card_and_J_shows_it(fake_driver, launch_app, tmp_path):
    from gpumon.jobs import records as jobs
    from gpumon.tui.jobs.screen import JobsScreen
    from gpumon.tui.screens.run_dialog import RunDialog

    app = launch_app
    out = tmp_path / "cvd"

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("j", "j", "r")
            assert isinstance(app.screen, RunDialog)
            await pilot.press(*f"echo $CUDA_VISIBLE_DEVICES > {out}; echo hello; sleep 30")
            await pilot.press("enter")
            assert not isinstance(app.screen, RunDialog)
            for _ in range(100):
                if out.exists() and out.read_text():
                    break
                await pilot.pause(0.1)
            assert out.read_text().strip() == fake_driver.machine.cards[2].uuid
            (job,) = jobs.list_jobs()
            assert job.spec.gpu_indices == [2] and job.state == "running"
            await pilot.press("J")
            assert isinstance(app.screen, JobsScreen)
            await pilot.pause(1.5)
            assert "hello" in "\n".join(app.screen.query_one("#jobs-log").lines)
            await pilot.press("s", "y")  # stop it, after confirming
            for _ in range(100):
                if jobs.list_jobs()[0].state == "killed":
                    break
                await pilot.pause(0.1)
            assert jobs.list_jobs()[0].reason == "stopped by the user"
            await pilot.press("p")
            assert app.main_screen.query_one("#filter").value == job.spec.id

    run(go())


def test_run_dialog_checks_its_input_and_escape_cancels(fake_driver, launch_app):
    from gpumon.jobs import records as jobs
    from gpumon.tui.screens.run_dialog import RunDialog

    app = launch_app

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", "enter")
            assert isinstance(app.screen, RunDialog)
            assert "Type a command" in str(app.screen.query_one("#run-error").render())
            app.screen.query_one("#run-limit").value = "9X"
            await pilot.press(*"true", "enter")
            assert isinstance(app.screen, RunDialog) and "bad size" in str(app.screen.query_one("#run-error").render())
            await pilot.press("escape")
            assert not isinstance(app.screen, RunDialog)
        assert jobs.list_jobs() == []

    run(go())


def test_m_sets_the_cards_default_limit_used_by_r(fake_driver, launch_app):
    from gpumon.jobs.launch import card_limits
    from gpumon.tui.screens.run_dialog import MemLimitDialog, RunDialog

    app = launch_app

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("j", "m")
            assert isinstance(app.screen, MemLimitDialog)
            await pilot.press(*"25%", "enter")
            uuid = fake_driver.machine.cards[1].uuid
            assert card_limits().get(uuid) == 6 * GIB
            await pilot.press("r")
            assert isinstance(app.screen, RunDialog)
            assert app.screen.query_one("#run-limit").value == "6.0G"

    run(go())


def test_launching_is_not_offered_readonly_or_on_replays(fake_driver, launch_app):
    app = launch_app
    app.main_screen.readonly = True

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            assert screen.check_action("run", ()) is False

    run(go())


def test_changed_span_finds_what_to_repaint():
    from rich.text import Text

    from gpumon.tui.widgets.changed_cells import changed_span

    assert changed_span(Text("util 40%"), Text("util 40%")) is None
    assert changed_span(Text("util 40% temp 50C"), Text("util 47% temp 51C")) == (6, 16)
    styled_old, styled_new = Text("ab"), Text("ab")
    styled_new.stylize("bold", 1, 2)
    assert changed_span(styled_old, styled_new) == (1, 2)
    assert changed_span(Text("abc"), Text("abcdef")) == (3, 6)


def test_clicking_a_header_sorts_by_it():
    async def go():
        async with create_app(DemoBackend(), interval=0.1).run_test(size=(120, 40)) as pilot:
            screen = await started(pilot)
            table = screen.query_one(ProcessTable)
            pid_x = table._x(1) + 1
            await pilot.click("#processes", offset=(pid_x, 0))  # the header: the table's first line
            assert table.sort_key == "pid" and table.sort_reverse is False
            await pilot.click("#processes", offset=(pid_x, 0))
            assert table.sort_reverse is True
            await pilot.pause(0.3)
            assert table_pids(screen) == sorted(table_pids(screen), reverse=True)

    run(go())


def _per_cell(text) -> list[tuple[str, frozenset]]:
    cells = [(char, set()) for char in text.plain]
    for span in text.spans:
        for i in range(span.start, min(span.end, len(cells))):
            cells[i][1].add(span.style)
    return [(char, frozenset(styles)) for char, styles in cells]


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab 9%█", max_size=12), st.text(alphabet="ab 9%█", max_size=12),
       st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12), st.sampled_from(["bold", "red", "dim"])),
                max_size=3),
       st.lists(st.tuples(st.integers(0, 12), st.integers(0, 12), st.sampled_from(["bold", "red", "dim"])),
                max_size=3))
def test_changed_span_covers_every_cell_that_changed(a, b, spans_a, spans_b):
    """Whatever changes between two lines (characters, styles, lengths), every cell whose
    character or styles differ lies inside the span that is repainted."""
    from rich.text import Text

    from gpumon.tui.widgets.changed_cells import changed_span

    old, new = Text(a), Text(b)
    for text, spans in ((old, spans_a), (new, spans_b)):
        for start, end, style in spans:
            text.stylize(style, start, end)
    before, after = _per_cell(old), _per_cell(new)
    differing = [i for i in range(max(len(before), len(after)))
                 if i >= len(before) or i >= len(after) or before[i] != after[i]]
    span = changed_span(old, new)
    if not differing:
        return
    assert span is not None and span[0] <= min(differing) and max(differing) < span[1]


def _cells(strip) -> list[tuple[str, object]]:
    return [(char, segment.style) for segment in strip for char in segment.text]


STYLES = ["", "bold", "red", "on blue"]
pieces = st.recursive(
    st.tuples(st.text(alphabet="ab %█°", max_size=6), st.sampled_from(STYLES)),
    lambda inner: st.tuples(st.sampled_from(STYLES), st.lists(inner, max_size=4)),  # a Text appended whole
    max_leaves=10)


def _build(line, piece) -> None:
    from rich.style import Style
    from rich.text import Text

    if isinstance(piece[1], list):  # (own style, pieces): built apart, then appended with append_text
        inner = Text(style=piece[0])
        for part in piece[1]:
            _build(inner, part)
        line.append_text(inner)
    else:
        text, style = piece
        line.append(text, style=Style.parse(style) if style and len(text) % 2 else style)


@settings(max_examples=400, deadline=None)
@given(st.lists(pieces, max_size=5), st.sampled_from(["", "italic", "green"]),
       st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20), st.sampled_from(["bold", "reverse"])), max_size=2),
       st.integers(1, 30))
def test_a_line_is_drawn_as_rich_draws_it(parts, own, overlaps, width):
    """line_strip cuts appended lines (texts appended into texts too) straight from their spans;
    the cells must be Rich's own, overlapping styles (stylize) included."""
    from rich.console import Console
    from rich.segment import Segment
    from rich.style import Style
    from rich.text import Text
    from textual.strip import Strip

    from gpumon.tui.widgets.changed_cells import line_strip

    console = Console()
    line = Text(style=own)
    for part in parts:
        _build(line, part)
    for start, end, style in overlaps:
        line.stylize(style, start, end)
    base = Style.parse("white on black")
    own_style = base + console.get_style(own)
    expected = Strip(list(Segment.apply_style(line.render(console, end=""), own_style))).crop_extend(0, width, base)
    assert _cells(line_strip(line, width, base, console)) == _cells(expected)


@pytest.mark.parametrize("size", [(200, 50), (100, 30), (70, 16)])
def test_widgets_drawing_whole_lines_look_as_textuals_own_way_draws_them(size):
    """The card panels, the process table and the status line skip Textual's boxing of each line
    (unboxed_lines.py). The screen must be, cell for cell, what Textual's own way draws: with a
    scrollbar beside the table, the cursor on it, and with padding a theme gives it."""
    from textual._styles_cache import StylesCache

    from gpumon.tui.widgets.unboxed_lines import UnboxedLinesCache

    def cells(screen) -> list[list[tuple]]:
        return [[(char, segment.style) for segment in strip for char in segment.text]
                for strip in screen._compositor.render_strips()]

    def as_textual_draws(screen) -> list[list[tuple]]:
        widgets = [w for w in screen.walk_children() if isinstance(w._styles_cache, UnboxedLinesCache)]
        ours = [w._styles_cache for w in widgets]
        for widget in widgets:
            widget._styles_cache = StylesCache()
        try:
            return cells(screen)
        finally:
            for widget, cache in zip(widgets, ours):
                widget._styles_cache = cache

    async def go():
        async with create_app(DemoBackend(cards=6), interval=0.2).run_test(size=size) as pilot:
            screen = await started(pilot)
            table = screen.query_one(ProcessTable)
            drawn_whole = (table, screen.status_bar, *screen.cards.panels)
            assert {type(w._styles_cache) for w in drawn_whole} == {UnboxedLinesCache}
            await pilot.press("j", "tab", "down")
            await pilot.pause(0.5)
            assert cells(screen) == as_textual_draws(screen)
            if size[1] < 20:
                assert table.show_vertical_scrollbar
            table.styles.padding = (0, 1)
            table.refresh()
            await pilot.pause(0.3)
            assert cells(screen) == as_textual_draws(screen)

    run(go())
