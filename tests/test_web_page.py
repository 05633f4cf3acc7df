"""`gpumon serve` in a real browser (Debian's Chromium through playwright): the real program against
the fake driver, its page live over Server-Sent Events, and text from the cards and processes shown
as text."""

from __future__ import annotations

import sys
import time

from conftest import GIB, Card
from webpage import Served, browser, get  # noqa: F401 - browser is a fixture

A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"
INTERVAL = 1.0
REMAPS = dict(remap_cor=0, remap_unc=0, remap_pending=0, remap_failure=0)


def serve(fake_driver, *args: str) -> Served:
    argv = [sys.executable, "-m", "gpumon", "serve", "--listen", "127.0.0.1:0", "--interval", str(INTERVAL), *args]
    return Served(argv, fake_driver.env)


def card_value(page, card: str, row: str = "util") -> str:
    return page.locator(f'[data-card="{card}"] .row:has(.label:text-is("{row}")) .value').text_content()


def test_the_grid_shows_the_fake_drivers_cards_and_a_change_within_two_intervals(fake_driver, idle_processes,
                                                                               browser):  # noqa: F811
    holder = idle_processes()
    m = fake_driver.machine
    m.cards = [Card(A100, extra=dict(util=10, temp=41, power_mw=90000, power_limit_mw=400000)),
               Card(H100, mem_total=80 * GIB, extra=dict(util=0, mem_used=0))]
    m.procs = [dict(gpu=0, pid=holder.pid, mem=8 * GIB)]
    fake_driver.write()
    with serve(fake_driver) as served:
        page = browser.new_page()
        page.goto(served.url)
        page.wait_for_selector('[data-card="1"]')
        assert page.locator(".card").count() == 2
        assert page.locator('[data-card="0"] .name').text_content() == A100
        assert page.locator('[data-card="1"] .name').text_content() == H100
        assert card_value(page, "0") == "10%"
        assert page.locator('[data-card="0"] .temp').text_content() == "41 °C"
        assert page.locator('[data-card="0"] .power').text_content() == "90 W / 400 W"
        # Card 1 is idle and empty: free; card 0 holds 8 GiB of 40 (20 % > 10 %): busy, held by the process's user.
        assert page.locator('[data-card="1"]').get_attribute("data-free") == "yes"
        assert page.locator('[data-card="0"]').get_attribute("data-free") == "no"
        assert page.locator("#summary").text_content().startswith("1 of 2 cards free")
        user = page.locator(".procs tbody tr td").nth(2).text_content()
        assert page.locator('[data-card="0"] .owner').text_content() == f"held by {user}"
        headers = page.locator(".procs th").all_text_contents()
        assert headers == ["GPU", "PID", "USER", "OWNER", "MEMORY", "COMMAND"]
        row = page.locator(".procs tbody tr").first.locator("td").all_text_contents()
        assert row[:2] == ["0", str(holder.pid)] and row[4] == "8.0G" and "sleep(600)" in row[5]
        assert page.locator('[data-card="0"] .badge').text_content() == "✓ OK"

        # The driver changes: card 1 gets busy. The first sample that shows it on the page was
        # taken within two intervals of the change.
        m.cards[1].extra.update(util=87)
        changed = time.time()
        fake_driver.write()
        shown = page.wait_for_function(
            """() => { const v = document.querySelector('[data-card="1"] .row .value');
                       return v && v.textContent === '87%' ? Number(document.body.dataset.time) : null }""",
            timeout=30_000, polling=20).json_value()
        seen = time.time()
        assert shown - changed <= 2 * INTERVAL, f"the sample showing it was taken {shown - changed:.2f} s after"
        assert seen - changed <= 2 * INTERVAL + 1.0, f"on the page {seen - changed:.2f} s after the change"
        assert page.locator('[data-card="1"]').get_attribute("data-free") == "no"
        assert page.locator("#summary").text_content().startswith("0 of 2 cards free")
        # The sparkline has the history this page has seen, the change at its end.
        points = page.locator('[data-card="1"] .spark polyline').last.get_attribute("points").split()
        assert len(points) >= 2 and points[-1].endswith(",13")
        page.close()


def test_a_card_going_bad_changes_its_badge(fake_driver, tmp_path, browser):  # noqa: F811
    """Once the page shows both cards healthy, a row remap is pending on card 0 (health fail) and
    card 1 is lost. (The change is written when the page has shown them, not at a time: on a busy
    machine the server and the browser may take longer to start than any such delay.)"""
    config = tmp_path / "config.toml"
    config.write_text('[health]\ninterval = "1s"\n')
    fake_driver.machine.cards = [Card(A100, extra=dict(REMAPS)), Card(A100)]
    fake_driver.write()
    with serve(fake_driver, "--config", str(config)) as served:
        page = browser.new_page()
        page.goto(served.url)
        page.wait_for_selector('[data-card="1"]')
        assert page.locator('[data-card="0"] .badge').text_content() == "✓ OK"
        fake_driver.machine.cards[0].extra.update(remap_pending=1)
        fake_driver.machine.cards[1].extra.update(lost_after=0)  # from the driver's reload of its file: at once
        fake_driver.write()
        page.wait_for_selector('[data-card="0"][data-verdict="fail"]', timeout=30_000)
        page.wait_for_selector('[data-card="1"][data-verdict="fail"]', timeout=30_000)
        assert page.locator('[data-card="0"] .badge').text_content() == "✗ FAIL"
        assert "row remap is pending" in page.locator('[data-card="0"] .reasons').text_content()
        assert page.locator('[data-card="1"] .badge').text_content() == "✗ FAIL"
        assert "lost" in page.locator('[data-card="1"] .card-state').text_content()
        assert page.locator('[data-card="0"]').get_attribute("data-free") == "no"  # never offered as free
        assert "2 failing" in page.locator("#summary").text_content()
        status, _, body = get(served.base + "/api/health")
        assert status == 200 and b'"verdict": "fail"' in body
        page.close()


HOSTILE = ["<img src=x onerror=window.__pwned=1>", "[bold]x[/bold]", "\x1b]0;pwned\x07", "\u202eevil"]


def test_hostile_names_show_as_literal_text(fake_driver, idle_processes, browser):  # noqa: F811
    proc = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", *HOSTILE)
    fake_driver.machine.cards = [Card('<b onmouseover=alert(1)>card</b> [red]A100')]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=GIB)]
    fake_driver.write()
    with serve(fake_driver) as served:
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(served.url)
        page.wait_for_selector(".procs tbody tr")
        command = page.locator(".procs td.command").text_content()
        assert "<img src=x onerror=window.__pwned=1>" in command and "[bold]x[/bold]" in command
        assert "\\x1b]0;pwned\\x07" in command and "\\u202eevil" in command  # control characters made visible
        assert "\x1b" not in command and "\u202e" not in command
        assert page.locator('[data-card="0"] .name').text_content() == '<b onmouseover=alert(1)>card</b> [red]A100'
        assert page.locator("main img, main b").count() == 0
        assert page.evaluate("() => window.__pwned") is None and not errors
        page.close()
