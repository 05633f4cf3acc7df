"""Text from another host, or from a job, is data on screen: never Textual markup, never an action
link, and its control characters never reach the terminal. The real fleet TUI in a real terminal
(tmux) over a real sshd, with a remote "gpumon" (a script passed as --remote-gpumon) that answers
every subcommand the TUI uses (snapshot --stream, jobs, run, signal, topo) with such strings; and
the local `J` log pane with a real job whose output has escape sequences, markup and bidi controls."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from conftest import GIB, Card
from test_fleet_tui_ssh import quit_tui, row, start_tui, type_text

# Each is checked on screen as the characters it is made of (control ones as visible escapes).
MARKUP = ("[/]", "[bold]x[/bold]", "[@click=app.quit]q[/]")
ESCAPES = "\x1b]0;pwned\x07\x1b[2J"
BIDI = "\u202eevil\u2066"
SHOWN_ESCAPES = "\\x1b]0;pwned\\x07\\x1b[2J"
SHOWN_BIDI = "\\u202eevil\\u2066"

# The remote gpumon. GPUMON_TEST_MODE=text: a valid schema-1 stream, job list, topology, launch
# and stop answers full of those strings; =broken: every command fails with them on stderr.
REMOTE = r'''#!PYTHON
import json, os, sys, time
MARKUP = MARKUP_LIST
ESC, BIDI = ESCAPES_TEXT, BIDI_TEXT
ALL = " ".join(MARKUP) + " " + ESC + " " + BIDI
argv = sys.argv[1:]
if os.environ.get("GPUMON_TEST_MODE") == "broken":
    if "--stream" in argv:
        time.sleep(0.5)
    sys.stderr.write("gpumon: error: " + ALL + "\n")
    sys.exit(1)
card = {"index": 0, "uuid": "GPU-11111111-2222-3333-4444-555555555555", "name": MARKUP[1] + " " + BIDI,
        "pci_bus_id": "00000000:01:00.0", "state": "ok", "utilization_gpu": 3, "memory_total": 80 << 30,
        "memory_used": 1 << 30, "memory_free": 79 << 30, "temperature": 40, "pstate": MARKUP[0],
        "processes": [{"pid": 4242, "type": "compute", "user": MARKUP[0] + BIDI, "command": ESC + " " + MARKUP[2],
                       "gpu_memory": 1 << 30}]}
job = {"id": "[b]j1[/b]", "state": "running", "name": MARKUP[0] + "job", "command": [ESC, MARKUP[2], BIDI],
       "log": MARKUP[1], "reason": None, "signal": MARKUP[0], "host": MARKUP[1], "pid": 4242, "exit_code": None,
       "started": time.time() - 60, "ended": None, "gpus": [card["uuid"]], "gpu_indices": [0],
       "mem_limit": None, "peak_gpu_memory": None}
out = sys.stdout
if argv[:1] == ["snapshot"] and "--stream" in argv:
    for _ in range(1200):
        doc = {"schema": 1, "time": time.time(), "host": MARKUP[2], "backend": "nvml",
               "driver_version": MARKUP[0], "cuda_driver_version": ESC, "gpus": [card]}
        out.write(json.dumps(doc) + "\n")
        out.flush()
        time.sleep(0.5)
elif argv[:2] == ["jobs", "--json"]:
    print(json.dumps([job]))
elif argv[:2] == ["jobs", "--log"] and os.environ.get("GPUMON_TEST_MODE") == "endless":
    chunk = "x" * (1 << 20)  # a job's line that never ends: 256 MiB without a newline
    for _ in range(256):
        out.write(chunk)
        out.flush()
    sys.stdin.read()
elif argv[:2] == ["jobs", "--log"]:
    for piece in MARKUP + (ESC, BIDI):
        print("log: " + piece, flush=True)
    sys.stdin.read()  # until the other side stops following (the connection closes)
elif argv[:2] == ["jobs", "--stop"]:
    print("stopped: " + MARKUP[2])
elif argv[:2] == ["run", "--json"]:  # the job it made, and its lines for people
    print(json.dumps({"job": job, "summary": ["ran: " + piece for piece in MARKUP + (ESC, BIDI)]}))
elif argv[:1] == ["signal"]:
    sys.stderr.write("gpumon: error: not signalled: " + MARKUP[0] + " " + MARKUP[2] + "\n")
    sys.exit(1)
elif argv[:2] == ["topo", "--json"]:
    print(json.dumps({"gpus": [{"index": 0, "links": {"0": "X"}, "cpu_affinity": MARKUP[0] + "0-7" + MARKUP[1],
                                "numa_node": 0}]}))
else:
    sys.stderr.write("gpumon: error: not in this fake: " + " ".join(argv) + "\n")
    sys.exit(2)
'''


def remote_script(folder: Path) -> Path:
    script = folder / "hostile-gpumon"
    text = (REMOTE.replace("PYTHON", sys.executable).replace("MARKUP_LIST", repr(MARKUP))
            .replace("ESCAPES_TEXT", repr(ESCAPES)).replace("BIDI_TEXT", repr(BIDI)))
    script.write_text(text)
    script.chmod(0o755)
    return script


def alive(status: Path) -> bool:
    return not status.exists()


def click(tmux, x: int, y: int) -> None:
    """A left click at column x, row y (from 0) as the terminal reports it (SGR mouse mode)."""
    for end in "Mm":  # press, release
        tmux("send-keys", "-t", "t", "-l", f"\x1b[<0;{x + 1};{y + 1}{end}")


def test_a_hosts_markup_escapes_and_bidi_are_shown_as_text_everywhere(ssh_lab, tmux_session, tmp_path):
    ssh_lab.host("evil", env={"GPUMON_TEST_MODE": "text"})
    ssh_lab.host("broken", env={"GPUMON_TEST_MODE": "broken"})
    tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "evil,broken", size=(160, 45),
                             remote=str(remote_script(tmp_path)))
    # The overview: the broken host's error as the characters it is made of.
    screen = tmux.wait_for(lambda s: "live" in row(s, "evil") and "error" in row(s, "broken"), timeout=60,
                           what="evil live, broken in error")
    assert "[/] [bold]x[/bold]" in row(screen, "broken")

    # Enter on the broken host: its view says why there is nothing, as text.
    tmux.keys("Down", "Enter")
    screen = tmux.wait_for(lambda s: "gpumon broken" in s and "[@click=app.quit]q[/]" in s,
                           what="the broken host's view with its error as text")
    assert SHOWN_ESCAPES in screen and SHOWN_BIDI in screen and "[/] [bold]x[/bold]" in screen
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "Hosts · 2" in s, what="back on the overview")

    # Enter on the host with hostile names: card name, pstate, process user and command, driver.
    tmux.keys("Up", "Enter")
    screen = tmux.wait_for(lambda s: "4242" in s and "[bold]x[/bold] " + SHOWN_BIDI in s,
                           what="the card name as text")
    assert f"{SHOWN_ESCAPES} [@click=app.quit]q[/]" in screen  # the process's command line
    assert "[/]" + SHOWN_BIDI[:8] in screen  # its user, cut to the column
    assert "driver [/]" in screen and "CUDA " + SHOWN_ESCAPES in screen
    assert "pwned" not in tmux("display-message", "-p", "#{pane_title}")

    # t: the host's topology, its CPU affinity as text.
    tmux.keys("t")
    tmux.wait_for(lambda s: "[/]0-7[bold]x[/bold]" in s, what="the topology's CPU affinity as text")
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "CPU Affinity" not in s, what="the topology closed")

    # x: the host refuses with hostile words; the notification shows them.
    tmux.keys("Tab", "x")
    tmux.wait_for(lambda s: "Send SIGTERM to process 4242 on evil?" in s, what="the confirmation")
    tmux.keys("y")
    tmux.wait_for(lambda s: "not signalled: [/] [@click=app.quit]q[/]" in s, what="the host's refusal as text")

    # r: the run dialog's title names the card; the launch answer is shown as text.
    tmux.keys("r")
    tmux.wait_for(lambda s: "Run on evil:0: [bold]x[/bold]" in s, what="the run dialog, its title as text")
    type_text(tmux, "sleep 1")
    tmux.keys("Enter")
    screen = tmux.wait_for(lambda s: "launched on evil:0" in s and "ran: " + SHOWN_BIDI in s, timeout=30,
                           what="the launch's answer as text")
    for piece in MARKUP + (SHOWN_ESCAPES,):
        assert "ran: " + piece in screen, piece
    # A click where the link would be, were it markup (that click would quit): the toast goes, the TUI stays.
    y, line = next((y, ln) for y, ln in enumerate(screen.splitlines()) if "ran: [@click" in ln)
    click(tmux, line.index("ran: [@click") + len("ran: "), y)
    tmux.wait_for(lambda s: "ran: [@click" not in s, what="the clicked notification gone")
    time.sleep(1)
    assert alive(status), "a click on a host's text ended the TUI"

    # J: the hosts' jobs, the selected one's record and log, all as text; s stops it there.
    tmux.keys("J")
    screen = tmux.wait_for(lambda s: "Jobs on every host" in s and "[b]j1[/b]" in s and "log: " + SHOWN_BIDI in s,
                           timeout=30, what="the job and its log as text")
    line = next(ln for ln in screen.splitlines() if "[b]j1[/b]" in ln)
    assert "[/]job" in line and "running" in line and line.count("[/]") >= 2  # name, exit column
    # its command, as a shell would read it (shlex-quoted), the quoted strings still made visible
    assert f"$ '{SHOWN_ESCAPES}' '[@click=app.quit]q[/]' '{SHOWN_BIDI}'" in screen
    assert "log on evil: [bold]x[/bold]" in screen
    for piece in MARKUP + (SHOWN_ESCAPES,):
        assert "log: " + piece in screen, piece
    tmux.keys("s")
    tmux.wait_for(lambda s: "on evil?" in s, what="stop confirmation")
    tmux.keys("y")
    tmux.wait_for(lambda s: "evil: stopped: [@click=app.quit]q[/]" in s, timeout=30, what="the stop answer as text")
    # p: the job's processes in the host's view, filtered by its id (in the table's title).
    tmux.keys("p")
    tmux.wait_for(lambda s: "filter “[b]j1[/b]”" in s and "Jobs on every host" not in s, timeout=30,
                  what="the host's view filtered by the job's id, as text")
    assert "pwned" not in tmux("display-message", "-p", "#{pane_title}")
    assert alive(status), "the TUI ended on its own"
    tmux.keys("Escape")  # the filter
    tmux.wait_for(lambda s: "filter “" not in s, what="the filter cleared")
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "Hosts · 2" in s, what="back on the overview")
    assert alive(status), "the TUI ended on its own"
    quit_tui(tmux, status)


def test_the_local_jobs_log_and_a_processs_environment_show_escapes_markup_and_bidi_as_text(
        fake_driver, tmux_session, tmp_path):
    # A process on the card whose environment holds markup and escape sequences (a PS1 does).
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={**os.environ, "HOSTILE_VALUE": "[/] [bold]x[/bold] \x1b[2J" + BIDI})
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.procs = [dict(gpu=0, pid=holder.pid, mem=GIB)]
    fake_driver.write()
    # A training log's colour codes and cursor moves, markup and a right-to-left override.
    output = r"printf 'step 1 \033[31mred\033[0m \033[2J\033[H\033[5;5Hmoved [/] [bold]x[/bold] \342\200\256rtl\n'"
    done = fake_driver.run("run", "--gpu", "0", "--name", "noisy", "--", "sh", "-c", output + "; sleep 120")
    assert done.returncode == 0, done.stderr
    status = tmp_path / "status"
    keep = ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "TZ")
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items() if k in keep)
    tmux = tmux_session(120, 36)
    try:
        tmux.start(f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon --interval 0.5; "
                   f"echo $? > {status}")
        # The first sample, not just the frame ("reading the cards…"): the process row is there.
        tmux.wait_for(lambda s: "Processes" in s and str(holder.pid) in s, timeout=30, what="the dashboard")
        tmux.keys("J")
        shown = ("step 1 \\x1b[31mred\\x1b[0m \\x1b[2J\\x1b[H\\x1b[5;5Hmoved [/] [bold]x[/bold] \\u202ertl")
        screen = tmux.wait_for(lambda s: shown in s, timeout=30, what="the log with its escapes made visible")
        lines = screen.splitlines()
        # The rest of the screen is where it was: the status line, the box, the table, the footer.
        assert lines[0].lstrip().startswith("gpumon"), lines[0]
        assert any("Jobs" in ln and "╭" in ln or "Jobs" in ln and "┌" in ln for ln in lines), screen
        assert any("ID" in ln and "NAME" in ln and "STATE" in ln for ln in lines), screen
        assert any("noisy" in ln and "running" in ln for ln in lines), screen
        assert sum(shown in ln for ln in lines) == 1 and "q Quit" in lines[-1], screen
        tmux.keys("Escape")
        tmux.wait_for(lambda s: "Processes" in s and shown not in s, what="the jobs closed")
        tmux.keys("Tab", "e")
        screen = tmux.wait_for(lambda s: "HOSTILE_VALUE" in s, what="the process's environment")
        line = next(ln for ln in screen.splitlines() if "HOSTILE_VALUE" in ln)
        assert "[/] [bold]x[/bold] \\x1b[2J" + SHOWN_BIDI in line, line
        tmux.keys("Escape")
        tmux.wait_for(lambda s: "HOSTILE_VALUE" not in s, what="the environment closed")
        tmux.keys("q")
        deadline = time.monotonic() + 20
        while not status.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert status.read_text().strip() == "0"
    finally:
        holder.kill()
        holder.wait()
        stopped = fake_driver.run("jobs", "--json")
        for job_id in [j["id"] for j in json.loads(stopped.stdout or "[]") if j["state"] == "running"]:
            subprocess.run([sys.executable, "-m", "gpumon", "jobs", "--stop", job_id], env=fake_driver.env,
                           capture_output=True, timeout=60)


def test_a_jobs_log_line_that_never_ends_is_shown_in_pieces_with_bounded_memory(ssh_lab, tmux_session, tmp_path):
    """The fleet J's log follower reads a remote job's output: a line without an end is shown as
    it comes, not gathered whole (256 MiB here) in gpumon's memory."""
    import psutil

    ssh_lab.host("endless", env={"GPUMON_TEST_MODE": "endless"})
    tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "endless", remote=str(remote_script(tmp_path)))
    tmux.wait_for(lambda s: "live" in row(s, "endless"), timeout=60, what="the host live")
    shell = psutil.Process(int(tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip()))
    gpumon = next(p for p in shell.children(recursive=True) if "gpumon" in " ".join(p.cmdline()))
    tmux.keys("J")
    tmux.wait_for(lambda s: "xxxxxxxxxxxxxxxxxxxxxxxx" in s, timeout=60, what="the endless line in the log pane")
    peak = 0
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        peak = max(peak, gpumon.memory_info().rss)
        time.sleep(0.2)
    assert peak < 200 << 20, f"gpumon grew to {peak >> 20} MiB reading one line"
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "Hosts · 1" in s and "xxxxxxxx" not in s, what="back on the overview")
    quit_tui(tmux, status)
