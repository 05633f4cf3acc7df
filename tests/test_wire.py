"""The output layer under Textual (gpumon/tui/wire): only changed cells go out, and frames wait for
the terminal's answer. The real program through it in a real terminal: test_slow_link.py and every
tmux test."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gpumon.tui.wire import sgr
from gpumon.tui.wire.pacing import FIRST_WAIT_S, GIVE_UP, LOST_S, PROBE, Pacer
from gpumon.tui.wire.screen import ScreenDiff

W, H = 30, 6
STYLES = ["", "1", "1;38;5;251;48;5;236", "38;5;75;48;5;234", "7", "4;38;2;10;20;30", "48;5;235", "3;9"]


def frame(writes) -> str:
    """Textual-like output: a cursor move, then segments as Rich writes them."""
    out = []
    for y, x, style, text in writes:
        out.append(f"\x1b[{y + 1};{x + 1}H")
        out.append(f"\x1b[{style}m{text}\x1b[0m" if style else text)
    return "".join(out)


def visible(screen: ScreenDiff) -> list[list[tuple[str, tuple]]]:
    """What a person sees: characters and attributes, a blank's invisible attributes aside."""
    return [[(c, sgr.blank(s) if c == " " else s) for c, s in zip(screen._want_text[y], screen._want_style[y])]
            for y in range(screen.height)]


writes = st.lists(st.tuples(st.integers(0, H - 1), st.integers(0, W - 1), st.sampled_from(STYLES),
                            st.text(alphabet="ab █°漢 ", min_size=1, max_size=12)), max_size=8)


@settings(max_examples=300, deadline=None)
@given(st.lists(writes, min_size=1, max_size=6), st.lists(st.booleans(), min_size=6, max_size=6))
def test_the_terminal_ends_up_showing_what_textual_drew(frames, drawn):
    """Whatever frames arrive, and whichever of them are held back (a slow link), the terminal
    shows exactly the last state once a render goes out."""
    diff, terminal = ScreenDiff(W, H), ScreenDiff(W, H)
    diff.feed("\x1b[?1049h")
    terminal.feed(diff.render())
    for data, draw in zip(frames, drawn):
        diff.feed(frame(data))
        terminal.feed(diff.render(draw=draw))
    terminal.feed(diff.render())
    assert visible(terminal) == visible(diff)


def test_an_unchanged_frame_sends_nothing_and_a_changed_digit_sends_little():
    diff = ScreenDiff(80, 4)
    clock = [(0, 0, "1;38;5;251;48;5;236", " gpumon "), (0, 8, "38;5;245;48;5;236", "12:00:01")]
    diff.feed(frame(clock))
    first = diff.render()
    assert "12:00:01" in first
    diff.feed(frame(clock))
    assert diff.render() == ""
    clock[1] = (0, 8, "38;5;245;48;5;236", "12:00:02")
    diff.feed(frame(clock))
    out = diff.render()
    assert out.endswith("2") and len(out) < 12, repr(out)  # a cursor move and one digit


def test_a_changed_column_goes_down_the_column():
    """A table whose every row changes in the same two columns (CPU % and age ticking) is sent a
    column at a time, one short step down between cells, not an absolute move per row."""
    rows = [[(y, 0, "", f"pid{y:02d} "), (y, 6, "", "10"), (y, 9, "", "  cmd   "), (y, 17, "", "5")]
            for y in range(10)]
    diff, terminal = ScreenDiff(20, 10), ScreenDiff(20, 10)
    diff.feed(frame([cell for row in rows for cell in row]))
    terminal.feed(diff.render())
    changed = [[(y, 6, "", "37"), (y, 17, "", "6")] for y in range(10)]
    diff.feed(frame([cell for row in changed for cell in row]))
    out = diff.render()
    terminal.feed(out)
    assert visible(terminal) == visible(diff)
    # Row by row it would be an absolute move, two digits, a jump and a digit: 14 bytes a row.
    assert out.count("H") == 1 and len(out) <= 12 * 10 + 5, repr(out)


def test_only_changed_attributes_are_sent():
    old = sgr.apply(sgr.DEFAULT, "1;38;5;251;48;5;234")
    new = sgr.apply(sgr.DEFAULT, "1;38;5;77;48;5;234")
    assert sgr.change(old, new) == "\x1b[38;5;77m"
    assert sgr.change(new, sgr.DEFAULT) == "\x1b[0m"
    assert sgr.apply(new, "0") == sgr.DEFAULT
    # Unknown parameters are kept verbatim, never dropped.
    curly = sgr.apply(sgr.DEFAULT, "4:3")
    assert sgr.change(sgr.DEFAULT, curly) == "\x1b[0;4:3m"


def test_leaving_the_alternate_screen_draws_nothing_more():
    diff = ScreenDiff(20, 3)
    diff.feed("\x1b[?1049h" + frame([(0, 0, "1", "cards")]))
    diff.render()
    diff.feed(frame([(1, 0, "", "pending")]) + "\x1b[?1049l\x1b[?25h")
    out = diff.render()
    assert out.index("pending") < out.index("\x1b[?1049l")
    assert out.endswith("\x1b[?1049l\x1b[?25h") or out.endswith("\x1b[?25h")
    diff.feed(frame([(2, 0, "", "after")]))  # anything Textual draws later starts afresh
    assert "after" in diff.render()


def test_a_wide_character_is_never_split():
    diff, terminal = ScreenDiff(10, 1), ScreenDiff(10, 1)
    diff.feed(frame([(0, 0, "", "ab漢cd")]))
    terminal.feed(diff.render())
    diff.feed(frame([(0, 3, "", "x")]))  # over the right half of 漢
    terminal.feed(diff.render())
    assert visible(terminal) == visible(diff)
    assert "".join(diff._want_text[0]).startswith("ab x")


def test_frames_wait_for_the_terminals_answer():
    pacer = Pacer()
    assert pacer.may_draw(0.0)
    assert pacer.probe(0.0) == PROBE
    assert not pacer.may_draw(0.5)
    assert pacer.answered(2.0) and pacer.lag == 2.0
    assert pacer.may_draw(2.0)
    assert pacer.probe(2.0) == PROBE
    assert not pacer.may_draw(2.0 + LOST_S - 1)  # the terminal answers: wait for it
    assert pacer.may_draw(2.0 + LOST_S + 1)  # an answer went missing: go on
    assert not pacer.answered(99.0) or pacer.lag >= 0  # a stray report never breaks anything


def test_a_terminal_that_never_answers_is_drawn_to_as_usual():
    pacer = Pacer()
    now = 0.0
    for _ in range(GIVE_UP):
        assert pacer.probe(now) == PROBE
        now += FIRST_WAIT_S + 0.1
        assert pacer.may_draw(now)
    assert pacer.mute and pacer.probe(now) == "" and pacer.may_draw(now)
    assert pacer.answered(now) is False  # nothing asked any more: a report is somebody else's


def test_a_terminal_that_never_answers_is_not_taken_for_a_slow_link():
    pacer = Pacer()
    pacer.probe(0.0)
    assert pacer.behind(30.0) == 0.0  # nothing known: no "link behind", no low-bandwidth mode
    pacer.answered(0.5)
    pacer.probe(1.0)
    assert pacer.behind(4.0) == 3.0  # it answers: waiting 3 s for this one means 3 s behind


def test_compositor_updates_drawn_as_cells_match_textuals_own_string():
    """The direct path (wire/updates.py) leaves the same wanted screen, and sends the same bytes,
    as parsing the string Textual would have written for each update of the real dashboard."""
    from rich.color import ColorSystem
    from rich.console import Console
    from textual._compositor import ChopsUpdate, LayoutUpdate

    from gpumon.cards.backends.demo import DemoBackend
    from gpumon.tui.app import create_app
    from gpumon.tui.wire import updates

    app = create_app(DemoBackend(), interval=0.1)
    seen = []
    original = app._display
    app._display = lambda screen, renderable: (seen.append(renderable), original(screen, renderable))

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.6)
            seen.append(app.screen._compositor.render_update(full=True))
            await pilot.press("down", "s")
            await pilot.pause(0.3)

    asyncio.run(scenario())
    kinds = {type(u) for u in seen if updates.drawable(u)}
    assert kinds == {ChopsUpdate, LayoutUpdate}
    console = Console(color_system="256", force_terminal=True, width=120)
    by_string, by_cells = ScreenDiff(120, 40), ScreenDiff(120, 40)
    sent_string, sent_cells = [], []
    for update in filter(updates.drawable, seen):
        by_string.feed(update.render_segments(console))
        updates.draw(by_cells, update, ColorSystem.EIGHT_BIT)
        assert visible(by_cells) == visible(by_string)
        sent_string.append(by_string.render())
        sent_cells.append(by_cells.render())
    assert sent_cells == sent_string
    assert sum(map(len, sent_cells)) > 120 * 40  # a full screen and changes went through


def test_a_change_that_starts_inside_a_wide_character_draws_it_whole():
    """A changed span may start on the right half of a wide character: the direct path must not
    cut the character in two (Textual's own string writes the chop from its left edge)."""
    from rich.color import ColorSystem
    from rich.console import Console
    from rich.segment import Segment
    from textual._compositor import ChopsUpdate
    from textual.strip import Strip

    from gpumon.tui.wire import updates

    first = ChopsUpdate([{0: Strip([Segment("ab漢cd  ")])}], [(0, 0, 8)], [[8]])
    second = ChopsUpdate([{0: Strip([Segment("ab漢xy  ")])}], [(0, 3, 6)], [[8]])
    console = Console(color_system="256", force_terminal=True, width=8)
    by_string, by_cells = ScreenDiff(8, 1), ScreenDiff(8, 1)
    for update in (first, second):
        by_string.feed(update.render_segments(console))
        updates.draw(by_cells, update, ColorSystem.EIGHT_BIT)
    assert visible(by_cells) == visible(by_string)
    assert "".join(by_cells._want_text[0]) == "ab漢xy  "


def test_the_lean_compositor_leaves_the_screen_textuals_own_would():
    """Every partial update of the running dashboard (samples, keys, a toast and a dialog over it,
    the filter, a resize), rendered by LeanCompositor and by Textual's Compositor from the same
    changed regions, leaves the same screen; after all of them the screen equals a full render."""
    from rich.color import ColorSystem
    from textual._compositor import Compositor

    from gpumon.cards.backends.demo import DemoBackend
    from gpumon.tui.app import create_app
    from gpumon.tui.wire import compositor, updates

    screens = {"lean": ScreenDiff(120, 40), "textual": ScreenDiff(120, 40)}
    compared = []

    class Both(compositor.LeanCompositor):
        def render_full_update(self, simplify=False):
            update = super().render_full_update(simplify=simplify)
            for screen in screens.values():
                screen.resize(*self.size)
                updates.draw(screen, update, ColorSystem.EIGHT_BIT)
            return update

        def render_partial_update(self):
            changed = set(self._dirty_regions)
            lean = super().render_partial_update()
            self._dirty_regions.update(changed)
            textual = Compositor.render_partial_update(self)
            for name, update in (("lean", lean), ("textual", textual)):
                if update is not None:
                    updates.draw(screens[name], update, ColorSystem.EIGHT_BIT)
            compared.append(visible(screens["lean"]) == visible(screens["textual"]))
            return lean

    app = create_app(DemoBackend(cards=6), interval=0.1)

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            assert isinstance(app.screen._compositor, compositor.LeanCompositor)
            app.screen._compositor.__class__ = Both
            await pilot.pause(0.5)
            await pilot.press("down", "down", "s", "tab", "down")
            await pilot.pause(0.3)
            app.notify("a toast over the table and the panels")
            await pilot.pause(0.5)
            await pilot.press("slash", "d", "escape", "question_mark")
            await pilot.pause(0.3)
            await pilot.press("escape")
            await pilot.pause(0.3)
            await pilot.resize_terminal(100, 30)
            await pilot.pause(0.5)
            app.screen._compositor.__class__ = compositor.LeanCompositor
            final = ScreenDiff(*app.screen._compositor.size)
            updates.draw(final, app.screen._compositor.render_full_update(), ColorSystem.EIGHT_BIT)
            return final

    final = asyncio.run(scenario())
    assert len(compared) > 10 and all(compared)
    assert visible(screens["lean"]) == visible(final)


def test_changed_table_rows_render_the_table_not_the_frame_and_screen_behind_it():
    """Textual renders, and cuts up, every widget under a changed line; only the frontmost is drawn."""
    from textual.geometry import Region
    from textual.widget import Widget

    from gpumon.cards.backends.demo import DemoBackend
    from gpumon.tui.app import create_app

    app = create_app(DemoBackend(), interval=60)
    rendered: list[str] = []
    original = Widget.render_lines

    def render_lines(widget, crop):
        rendered.append(type(widget).__name__)
        return original(widget, crop)

    async def scenario():
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.5)
            screen = app.screen
            Widget.render_lines = render_lines
            try:
                for _ in range(50):  # until nothing else is drawn (a slow machine settles later)
                    rendered.clear()
                    await pilot.pause(0.1)
                    if not rendered:
                        break
                assert not rendered, f"the screen never settled: {rendered}"
                screen.status_bar.refresh(Region(0, 0, 8, 1))
                screen.table.refresh(Region(0, 1, 8, 1), Region(0, 2, 8, 1))
                await pilot.pause(0.2)
            finally:
                Widget.render_lines = original

    asyncio.run(scenario())
    assert sorted(set(rendered)) == ["ProcessTable", "StatusBar"]
