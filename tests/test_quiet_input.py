"""The terminal's input thread sleeps until a key comes (gpumon/tui/wire/quiet_input.py): Textual's
own woke ten times a second. Keys still arrive, a lone Escape is still the Escape key (the key
parser's timeout wakes the thread), and `q` still ends the program at once."""

from __future__ import annotations

import os
import re
import shlex
import sys
import time
from pathlib import Path

WINDOW_S = 3.0


def wakeups(pid: int, tid: int) -> int:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return int(re.search(r"^voluntary_ctxt_switches:\s+(\d+)", status, re.M)[1])


def test_the_input_thread_sleeps_until_a_key_comes(tmux_session, tmp_path):
    log, pid_file, status = tmp_path / "gpumon.log", tmp_path / "pid", tmp_path / "status"
    tmux = tmux_session(100, 30)
    # A sample a minute: between them only the status line's clock draws a frame (and the
    # terminal answers the question that ends each one, which the input thread reads).
    command = shlex.join([sys.executable, "-c", f"import os; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                          "import runpy, sys; sys.argv = ['gpumon', '--demo', '--interval', '60']; "
                          "runpy.run_module('gpumon', run_name='__main__')"])
    tmux.start(f"env GPUMON_LOG_FILE={log} TERM=xterm-256color {command}; echo $? > {status}; sleep 600")
    tmux.wait_for(lambda s: "Processes" in s and "Quit" in s, what="the dashboard")
    said = re.findall(r"input thread (\d+): waits for the terminal", log.read_text())
    assert said, log.read_text()
    pid, tid = int(pid_file.read_text()), int(said[-1])

    before = wakeups(pid, tid)
    time.sleep(WINDOW_S)  # a window to count in: a busy machine makes fewer wake-ups, never more
    woke = wakeups(pid, tid) - before
    # Textual's thread: at least one a tenth of a second (30 here); this one: a few answers.
    assert woke < 15, f"the input thread woke {woke} times in {WINDOW_S} s"

    tmux.keys("?")
    tmux.wait_for(lambda s: "gpumon keys" in s, what="the help")
    tmux("send-keys", "-t", "t", "Escape")  # alone: nothing follows it to say it is not a sequence
    tmux.wait_for(lambda s: "gpumon keys" not in s and "Processes" in s, what="Escape to close the help")
    tmux.keys("q")
    tmux.wait_for(lambda s: status.exists(), timeout=10, what="q to end gpumon")
    assert status.read_text().strip() == "0"
    assert not os.path.exists(f"/proc/{pid}")
