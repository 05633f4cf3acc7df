"""A bug inside the TUI is never a success: the real `gpumon` in a real terminal (tmux) whose key
handler fails ends with status 70 and the CLI's one line for bugs, on a restored terminal. (Textual
itself catches the error, prints a traceback and returns as if all went well.)

The failure is put there from outside: a sitecustomize on the PYTHONPATH of that one gpumon
process breaks the handler of `w`, as a bug in it would."""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

BROKEN_KEY = '''
import gpumon.tui.screens.main as main


def broken(self):
    raise RuntimeError("injected by the test [/]")


main.MainScreen.action_cycle_window = broken
'''
# The topology a fleet host's gpumon sent, shown when it arrives from a background thread.
BROKEN_ANSWER = '''
import gpumon.tui.screens.topology as topology


def broken(self, topo, reading):
    raise RuntimeError("injected by the test [/]")


topology.TopologyScreen.show_topology = broken
'''

# The same, in a Textual that renamed the hook gpumon overrides to keep the error (tests/textual_changed.py).
BROKEN_KEY_NEWER_TEXTUAL = f'''
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
import textual_changed
textual_changed.rename("_handle_exception")
{BROKEN_KEY}'''

ONE_LINE = ("gpumon: internal error: RuntimeError: injected by the test [/] "
            "(GPUMON_DEBUG=1 shows the traceback; please report it)")


def wait_for_file(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return path.read_text().strip() if path.exists() else ""


def start_broken(tmux_session, tmp_path: Path, sitecustomize: str, *args: str, debug: bool = False):
    """gpumon --demo ARGS in tmux with that sitecustomize; returns (tmux, the file of its exit status)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    status = tmp_path / "status"
    extra = " GPUMON_DEBUG=1" if debug else ""
    tmux = tmux_session(100, 30)
    tmux.start(f"env PYTHONPATH={shlex.quote(str(site))}{extra} TERM=xterm-256color "
               f"{shlex.quote(sys.executable)} -m gpumon --demo --interval 0.5 {shlex.join(args)}; "
               f"echo $? > {status}; sleep 120")
    return tmux, status


def crash_in_tmux(tmux_session, tmp_path: Path, debug: bool = False):
    tmux, status = start_broken(tmux_session, tmp_path, BROKEN_KEY, debug=debug)
    tmux.wait_for(lambda s: "Processes" in s, timeout=30, what="the dashboard")
    tmux.keys("w")
    return tmux, wait_for_file(status)


def left_on_screen(tmux, history: int = 0) -> list[str]:
    """The terminal's lines once gpumon has ended (wrapped lines joined; a `sleep` keeps the pane)."""
    shown = tmux("capture-pane", "-p", "-J", "-t", "t", "-S", str(-history))
    return [line.strip() for line in shown.splitlines() if line.strip()]


def test_an_error_in_the_tui_ends_it_with_status_70_and_one_line(tmux_session, tmp_path):
    tmux, status = crash_in_tmux(tmux_session, tmp_path)
    assert status == "70"
    # What is left on the terminal: that line alone (no traceback), on the normal screen.
    assert left_on_screen(tmux) == [ONE_LINE]
    # The terminal as it was: normal screen, cursor shown, no mouse reporting, normal keypad.
    flags = tmux("display-message", "-p", "-t", "t", "#{alternate_on} #{cursor_flag} #{mouse_any_flag} "
                 "#{mouse_button_flag} #{mouse_standard_flag} #{mouse_sgr_flag} #{keypad_cursor_flag}").split()
    assert flags == ["0", "1", "0", "0", "0", "0", "0"], flags


def test_gpumon_debug_shows_the_traceback_instead(tmux_session, tmp_path):
    tmux, status = crash_in_tmux(tmux_session, tmp_path, debug=True)
    assert status == "1"  # Python's own status for an uncaught error
    lines = left_on_screen(tmux, history=500)  # with the lines scrolled off
    assert "Traceback (most recent call last):" in lines and any(" in broken" in line for line in lines)
    assert lines[-1] == "RuntimeError: injected by the test [/]"


def test_an_error_handling_a_hosts_answer_ends_the_tui_the_same_way(tmux_session, tmp_path):
    """The answer comes back from a background thread (tui/background.py): its error is the app's,
    not a traceback that thread prints over the screen while the TUI goes on."""
    tmux, status = start_broken(tmux_session, tmp_path, BROKEN_ANSWER, "--hosts", "local")
    tmux.wait_for(lambda s: "1 live" in s, timeout=30, what="the fleet overview")
    tmux.keys("Enter")
    tmux.wait_for(lambda s: "Processes" in s, timeout=30, what="the host's view")
    tmux.keys("t")
    assert wait_for_file(status) == "70", tmux.screen()
    assert left_on_screen(tmux) == [ONE_LINE]


def test_a_textual_that_renamed_the_crash_hook_still_ends_with_status_70(tmux_session, tmp_path):
    tmux, status = start_broken(tmux_session, tmp_path, BROKEN_KEY_NEWER_TEXTUAL)
    tmux.wait_for(lambda s: "Processes" in s, timeout=30, what="the dashboard")
    tmux.keys("w")
    assert wait_for_file(status) == "70", tmux.screen()
    assert left_on_screen(tmux, history=500)[-1] == ("gpumon: internal error: RuntimeError: the TUI stopped on an "
                                                     "error (Textual's report is above) (GPUMON_DEBUG=1 shows the "
                                                     "traceback; please report it)")
