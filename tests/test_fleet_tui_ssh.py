"""The real fleet TUI (`gpumon --hosts …`) in a real terminal (tmux), over a real sshd whose aliases
are different fake machines (tests/sshd.py): every host on screen, a host that goes away and comes
back, and a job launched with `r` on exactly the card chosen, listed with `J`, followed and stopped
there; a remote process signalled with `x`."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from conftest import GIB, Card

UUIDS = [f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd" for i in range(4)]


def start_tui(ssh_lab, tmux_session, tmp_path: Path, hosts: str, size=(120, 40), remote: str | None = None,
              options: tuple[str, ...] = ()):
    """`gpumon --hosts HOSTS [OPTIONS]` in tmux with the lab's ssh; returns (tmux, file its exit status goes to)."""
    status = tmp_path / "status"
    env = ssh_lab.env()
    keep = ("PATH", "HOME", "TZ", "XDG_RUNTIME_DIR", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME")
    assigns = " ".join(f"{k}={shlex.quote(env[k])}" for k in keep if k in env)
    argv = ssh_lab.gpumon_argv("--hosts", hosts, "--interval", "0.5", *options, remote=remote)
    tmux = tmux_session(*size)
    tmux.start(f"env {assigns} TERM=xterm-256color {shlex.join(argv)}; echo $? > {status}")
    return tmux, status


def row(screen: str, host: str) -> str:
    """The overview's line of `host` (inside the table's border)."""
    for line in screen.splitlines():
        inside = line.strip("│ ")
        if inside.split()[:1] == [host]:
            return inside
    return ""


def quit_tui(tmux, status: Path) -> None:
    tmux.keys("q")
    deadline = time.monotonic() + 20
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.read_text().strip() == "0"


def type_text(tmux, text: str) -> None:
    """Typed as text (not keys), then waited for on screen: a burst of keys can read as a paste."""
    tmux("send-keys", "-t", "t", "-l", text)
    tmux.wait_for(lambda s: text[-20:] in s, what=f"typed {text!r}")


def test_every_host_on_screen_one_goes_away_the_others_update_and_it_comes_back(ssh_lab, tmux_session, tmp_path):
    steady, flaky = ssh_lab.server(), ssh_lab.server()
    h1 = ssh_lab.host("h1", server=steady)
    h1.machine.cards = [Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB, extra=dict(util=55, temp=61)),
                        Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB, extra=dict(util=0, temp=35))]
    h2 = ssh_lab.host("h2", server=steady)
    h2.machine.cards = [Card("NVIDIA A30", mem_total=24 * GIB, extra=dict(util=0, temp=40 + i)) for i in range(4)]
    h3 = ssh_lab.host("h3", server=flaky)
    h3.machine.cards = [Card(extra=dict(util=95, temp=88))]
    for host in (h1, h2, h3):
        host.write()
    tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "h1,h2,h3")

    screen = tmux.wait_for(lambda s: "3 hosts: 3 live" in s, timeout=60, what="every host live")
    assert row(screen, "h1").split()[:6] == ["h1", "live", "ok", "▒", "·", "1/2"]  # its cards' health: ok
    assert "61°C (0)" in row(screen, "h1")
    assert "4/4" in row(screen, "h2") and "43°C (3)" in row(screen, "h2")
    assert "0/1" in row(screen, "h3") and "88°C (0)" in row(screen, "h3")

    flaky.kill()  # the machine goes away: its sessions and its listener
    screen = tmux.wait_for(lambda s: "unreachable" in row(s, "h3") and "connection refused" in row(s, "h3"),
                           timeout=60, what="h3 unreachable, with the reason")
    assert "retry in" in row(screen, "h3")
    # The others keep updating while it is away…
    h1.machine.cards[0].extra["util"] = 3
    h1.write()
    tmux.wait_for(lambda s: "2/2" in row(s, "h1"), timeout=30, what="h1's news while h3 is away")
    # …and keys are answered: sort by free cards, then jump to a host by typing its name.
    tmux.keys("o")
    screen = tmux.wait_for(lambda s: "by free cards" in s, what="sorted by free cards")
    assert screen.index(row(screen, "h2")) < screen.index(row(screen, "h1")) < screen.index(row(screen, "h3"))
    tmux.keys("h", "3", "Enter")  # h3's own view says why it has nothing new
    tmux.wait_for(lambda s: "gpumon h3" in s and "unreachable: connection refused" in s, what="h3's view")
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "by free cards" in s, what="back on the overview")
    flaky.start()
    tmux.wait_for(lambda s: "3 hosts: 3 live" in s and "live" in row(s, "h3"), timeout=60,
                  what="h3 back (reconnected)")
    quit_tui(tmux, status)


def test_r_on_host_2_card_3_runs_there_J_follows_and_stops_it_and_x_signals_a_remote_process(
        ssh_lab, tmux_session, tmp_path):
    ssh_lab.host("h1").machine.cards = [Card()]
    ssh_lab.hosts["h1"].write()
    h2 = ssh_lab.host("h2")
    h2.machine.cards = [Card("NVIDIA A30", uuid=uuid, mem_total=24 * GIB) for uuid in UUIDS]
    h2.machine.scan_env = True  # the fake driver lists a process on the card its CUDA_VISIBLE_DEVICES names
    h2.write()
    # A process of "h2" on its card 1 (the same machine, really: the fake driver finds it by its environment).
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={**os.environ, "CUDA_VISIBLE_DEVICES": UUIDS[1]})
    out = tmp_path / "cvd"
    try:
        tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "h1,h2")
        tmux.wait_for(lambda s: "2 hosts: 2 live" in s, timeout=60, what="both hosts live")
        tmux.keys("Down", "Enter")  # h2's own view
        screen = tmux.wait_for(lambda s: "gpumon h2" in s and str(victim.pid) in s, timeout=30,
                               what="h2's view with its process")

        # x: the host's gpumon signals it, after a confirmation (start time checked there).
        tmux.keys("Tab", "x")
        tmux.wait_for(lambda s: f"Send SIGTERM to process {victim.pid} on h2?" in s, what="the confirmation")
        tmux.keys("y")
        assert victim.wait(30) == -signal.SIGTERM
        tmux.wait_for(lambda s: f"h2: sent SIGTERM to {victim.pid}" in s, what="the host's answer")

        # r on card 3: the job runs there, on exactly that card.
        tmux.keys("Tab", "Down", "Down", "Down", "r")
        tmux.wait_for(lambda s: "Run on h2:3: NVIDIA A30" in s, what="the run dialog for h2:3")
        type_text(tmux, f"echo started on $CUDA_VISIBLE_DEVICES; echo $CUDA_VISIBLE_DEVICES > {out}; sleep 120")
        tmux.keys("Enter")
        deadline = time.monotonic() + 60
        while not (out.exists() and out.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert out.read_text().strip() == UUIDS[3]
        tmux.wait_for(lambda s: "launched on h2:3" in s, timeout=30, what="the launch reported")
        (job,) = json.loads(ssh_lab.gpumon("jobs", "--hosts", "h2", "--json").stdout)
        assert (job["gpu_indices"], job["gpus"], job["state"]) == ([3], [UUIDS[3]], "running")
        # The host lists the job's process on card 3, and the view marks it as the job's.
        tmux.wait_for(lambda s: any(line.strip("│ ").startswith("3 ") and "[job echo]" in line
                                    for line in s.splitlines()), timeout=30, what="the job on card 3")

        # J: every host's jobs with a HOST column; the log follows; s stops it there.
        tmux.keys("J")
        screen = tmux.wait_for(lambda s: "Jobs on every host" in s and job["id"] in s and f"started on {UUIDS[3]}" in s,
                               timeout=30, what="the job and its log in J")
        words = next(line for line in screen.splitlines() if job["id"] in line).split()
        assert words[words.index(job["id"]) - 1] == "h2" and "running" in words  # its HOST column
        tmux.keys("p")  # its processes: h2's view, filtered by the job's id
        screen = tmux.wait_for(lambda s: f"filter “{job['id']}”" in s and "[job echo]" in s, timeout=30,
                               what="the job's processes in h2's view")
        assert "gpumon h2" in screen
        tmux.keys("J")
        tmux.wait_for(lambda s: any(job["id"] in line and "running" in line for line in s.splitlines()), timeout=30,
                      what="J again, once the hosts have answered")
        tmux.keys("s")
        tmux.wait_for(lambda s: "on h2?" in s, what="stop confirmation")
        tmux.keys("y")
        tmux.wait_for(lambda s: any(job["id"] in line and "killed" in line for line in s.splitlines()), timeout=30,
                      what="the job stopped")
        assert not psutil.pid_exists(job["pid"]) or psutil.Process(job["pid"]).status() == psutil.STATUS_ZOMBIE
        tmux.keys("Escape", "Escape", "Escape")  # the jobs, the filter, the host's view
        tmux.wait_for(lambda s: "2 hosts: 2 live" in s, what="back on the overview")
        quit_tui(tmux, status)
    finally:
        victim.kill()
        victim.wait()


def test_a_host_read_through_nvidia_smi_says_why_it_cannot_launch_and_hostile_text_stays_text(
        ssh_lab, tmux_session, tmp_path):
    """A host without gpumon (a stub nvidia-smi in NVIDIA's documented format) is marked and says why
    `r` and `x` do nothing there; a host whose "gpumon" sends terminal escapes shows them as text."""
    from test_fleet_untrusted import HOSTILE_GPUMON, STUB_NVIDIA_SMI

    hostile, stubs = tmp_path / "hostile-bin", tmp_path / "stub-bin"
    for folder, name, text in ((hostile, "gpumon", HOSTILE_GPUMON.replace("REAL", ssh_lab.remote_gpumon)),
                               (stubs, "nvidia-smi", STUB_NVIDIA_SMI)):
        folder.mkdir()
        (folder / name).write_text(text.replace("PYTHON", sys.executable))
        (folder / name).chmod(0o755)
    with_gpumon = ssh_lab.server(env={"PATH": f"{hostile}:/usr/bin:/bin"})
    agentless = ssh_lab.server(env={"PATH": f"{stubs}:/usr/bin:/bin"})
    ssh_lab.host("fine", server=with_gpumon).machine.cards = [Card()]
    ssh_lab.hosts["fine"].write()
    ssh_lab.host("evil", server=with_gpumon, env={"GPUMON_TEST_HOSTILE": "escape"})
    ssh_lab.host("bare", server=agentless)
    tmux, status = start_tui(ssh_lab, tmux_session, tmp_path, "fine,evil,bare", remote="gpumon")

    screen = tmux.wait_for(lambda s: "3 hosts: 3 live" in s, timeout=60, what="every host live")
    assert "read through nvidia-smi" in row(screen, "bare") and "1/2" in row(screen, "bare")
    tmux.keys("Down", "Enter")  # evil's own view: its card name as the escapes it is made of
    screen = tmux.wait_for(lambda s: "\\x1b]0;pwned" in s, what="escapes shown as text")
    assert "pwned" not in tmux("display-message", "-p", "#{pane_title}")
    tmux.keys("Escape")  # sent apart from the next key: ESC then ESC [ B in one read can be one Alt+Down
    tmux.wait_for(lambda s: "Hosts · 3" in s, what="back on the overview")
    tmux.keys("Down", "r")
    tmux.wait_for(lambda s: "bare is read through nvidia-smi: launching" in s, what="why r cannot launch there")
    tmux.keys("Enter")  # its view: cards and the process nvidia-smi lists, but no signals from here
    tmux.wait_for(lambda s: "RTX 3090" in s and "4242" in s, what="bare's cards and its process")
    tmux.keys("Tab", "x")
    tmux.wait_for(lambda s: "nvidia-smi: signalling a" in s, what="why x cannot signal there")
    tmux.keys("Escape")
    quit_tui(tmux, status)
