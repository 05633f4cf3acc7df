"""Use without a claim: another user's process on a card reserved (or claimed) by someone else,
started outside gpumon. Seen everywhere, in the same words, and never stopped: `users` (text and
JSON), a `watch` rule that fires once for the process and resolves when it leaves (its hook told
whose process on whose card), the exporter, the TUI (the process row and the card) and the page."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import time

import psutil
import pytest
from conftest import GIB, require_tool
from promlab import free_port, serve_and_scrape
from terminal import gpumon_command
from test_claims import free_cards, jobs
from test_web_page import serve
from webpage import browser  # noqa: F401 - a fixture


@pytest.fixture
def nobodys_process_on_a_reserved_card(fake_driver):
    """GPU 1 reserved by this user (root); a process of nobody's on it, as the driver lists it."""
    require_tool("runuser")
    free_cards(fake_driver.machine, 2)
    fake_driver.write()
    assert fake_driver.run("reserve", "--gpu", "1", "--for", "1h").returncode == 0
    runner = subprocess.Popen(["runuser", "-u", "nobody", "--", "sleep", "300"])
    try:
        deadline = time.monotonic() + 10
        while not (children := psutil.Process(runner.pid).children()) and time.monotonic() < deadline:
            time.sleep(0.02)
        sleeper = children[0] if children else psutil.Process(runner.pid)
        fake_driver.machine.procs = [dict(gpu=1, pid=sleeper.pid, mem=GIB, sm=40)]
        fake_driver.write()
        yield sleeper.pid
    finally:
        runner.kill()
        for child in psutil.Process(runner.pid).children() if runner.poll() is None else []:
            child.kill()
        runner.wait()
        for job in jobs(fake_driver):
            if job["state"] in ("running", "queued"):
                fake_driver.run("jobs", "--stop", job["id"])


def test_users_says_whose_process_is_on_whose_card(fake_driver, nobodys_process_on_a_reserved_card):
    pid = nobodys_process_on_a_reserved_card
    doc = json.loads(fake_driver.run("users", "--json", "--window", "1s", "--interval", "0.2").stdout)
    (use,) = doc["without_claim"]
    assert (use["gpu"], use["pid"], use["user"]) == (1, pid, "nobody")
    assert use["on"]["kind"] == "reservation" and use["on"]["user"] == "root" and use["on"]["until"]
    assert use["words"].startswith(f"nobody's sleep (pid {pid}) on GPU 1, reserved by root until ")
    text = fake_driver.run("users", "--window", "1s", "--interval", "0.2").stdout
    assert f"Without a claim: nobody's sleep (pid {pid}) on GPU 1, reserved by root until " in text


def test_watch_fires_once_and_resolves_when_the_process_leaves(fake_driver, nobodys_process_on_a_reserved_card,
                                                                tmp_path):
    pid = nobodys_process_on_a_reserved_card
    told = tmp_path / "told"
    hook = f"env | grep -E '^GPUMON_(PID|USER|HOLDER|HOLDER_KIND|DESCRIPTION)=' | sort >> {shlex.quote(str(told))}"
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "watch", "--alert", "unclaimed", "--interval", "0.2",
                              "--on-alert", hook], env=fake_driver.env, stdout=subprocess.PIPE, text=True)
    try:
        firing = json.loads(watch.stdout.readline())
        assert firing["event"] == "firing" and firing["rule"] == "unclaimed" and firing["gpu"] == 1
        assert firing["process"]["pid"] == pid and firing["process"]["on"]["user"] == "root"
        # The process leaves the card: resolved, once.
        fake_driver.machine.procs = []
        fake_driver.write()
        resolved = json.loads(watch.stdout.readline())
        assert resolved["event"] == "resolved" and resolved["process"]["pid"] == pid
    finally:
        watch.terminate()
        watch.wait(20)
    lines = told.read_text().splitlines()
    assert f"GPUMON_PID={pid}" in lines and "GPUMON_USER=nobody" in lines and "GPUMON_HOLDER=root" in lines
    assert "GPUMON_HOLDER_KIND=reservation" in lines
    assert any(line.startswith(f"GPUMON_DESCRIPTION=nobody's sleep (pid {pid}) on GPU 1") for line in lines)


def test_the_exporter_has_a_series_for_it(fake_driver, nobodys_process_on_a_reserved_card):
    pid = nobodys_process_on_a_reserved_card
    port = free_port()
    body = serve_and_scrape([sys.executable, "-m", "gpumon", "watch", "--prometheus", f"127.0.0.1:{port}",
                             "--interval", "0.2"], fake_driver.env, port,
                            lambda text: "gpumon_process_without_claim{" in text)
    line = next(x for x in body.splitlines() if x.startswith("gpumon_process_without_claim{"))
    assert f'pid="{pid}"' in line and 'user="nobody"' in line and 'holder="root"' in line
    assert 'kind="reserved"' in line and 'gpu="1"' in line and line.endswith(" 1.0")


def test_the_tui_marks_the_process_and_the_card(fake_driver, nobodys_process_on_a_reserved_card, tmux_session):
    pid = nobodys_process_on_a_reserved_card
    tmux = tmux_session(160, 40)
    tmux.start(gpumon_command(fake_driver.env, "--interval", "0.5"))
    screen = tmux.wait_for(lambda s: "[no claim: reserved by root until" in s, what="the process row's mark")
    row = next(line for line in screen.splitlines() if f" {pid} " in line)
    assert "nobody" in row and "[no claim: reserved by root until" in row
    assert "without a claim: nobody's sleep (pid" in screen  # on the card's panel


def test_the_page_says_it(fake_driver, nobodys_process_on_a_reserved_card, browser):  # noqa: F811
    pid = nobodys_process_on_a_reserved_card
    with serve(fake_driver) as served:
        page = browser.new_page()
        page.goto(served.url)
        page.wait_for_selector('[data-card="1"] .unclaimed')
        said = page.locator('[data-card="1"] .unclaimed').text_content()
        assert said.startswith(f"Without a claim: nobody's sleep (pid {pid}) on GPU 1, reserved by root until ")
        assert "[no claim: reserved by root until" in page.locator("td.unclaimed").first.text_content()
