"""The page's "last 7 days" section and /api/report: the usage ledger a real `gpumon watch` wrote of
two real users (tests/usage_lab.py), read by the real `gpumon serve`, shown in Debian's Chromium
as per-user bars and a per-card strip, every name as text."""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import time

from test_usage import ledger_env, two_holders, watch  # noqa: F401 - two_holders is a fixture
from usage_lab import two_users  # noqa: F401 - the fixture
from webpage import Served, browser, get  # noqa: F401 - browser is a fixture

HOSTILE = "<img src=x onerror=window.__pwned=1>"


def test_the_page_shows_the_last_7_days_from_the_ledger(fake_driver, tmp_path, two_holders, browser):  # noqa: F811
    a, b = two_holders
    db = tmp_path / "usage.sqlite"
    env = ledger_env(fake_driver, tmp_path, db)
    recorded = watch(env, "--count", "25")
    _, err = recorded.communicate(timeout=60)
    assert recorded.returncode == 0, err
    with sqlite3.connect(db) as conn:  # a name from elsewhere (a host's /etc/passwd, a job's name) is data
        conn.execute("INSERT INTO holders (kind, holder, label, user) VALUES ('user', ?, ?, ?)", (HOSTILE,) * 3)
        conn.execute("INSERT INTO holder_minutes VALUES (?, (SELECT min(id) FROM cards), last_insert_rowid(), "
                     "60, 0, 60, 0, 0, 0, 60)", (int(time.time() // 60 * 60),))
    argv = [sys.executable, "-m", "gpumon", "serve", "--interval", "0.5", "--listen", "127.0.0.1:0"]
    with Served(argv, env) as served:
        status, _, body = get(served.base + "/api/report")
        assert status == 200
        doc = json.loads(body)
        assert {r["id"] for r in doc["rows"] if r["kind"] == "user"} == {a, b, HOSTILE}
        assert doc["to"] - doc["from"] == 7 * 86400 and len(doc["cards"]) == 2

        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(served.url)
        page.wait_for_selector("#usage .usage-user")
        assert page.locator("#usage h2").text_content() == "Last 7 days"
        shown = page.locator("#usage .usage-user .label").all_text_contents()
        assert set(shown) == {a, b, HOSTILE}
        assert page.locator("#usage img").count() == 0 and page.evaluate("() => window.__pwned") is None
        strip = page.locator("#usage .usage-card")
        assert strip.count() == 2 and all("last used" in t for t in strip.locator(".value").all_text_contents())
        assert page.locator("#usage .usage-card .day").count() == 2  # one day of each card
        bars_agree_with_their_numbers(page)
        assert not errors
        page.close()


def shown_hours(text: str) -> float:
    """The GPU time a row's words say, in hours ('2.5 GPU-h', '1.2 GPU-min', '40 GPU-s')."""
    number, unit = re.match(r"([\d.]+) GPU-(h|min|s)\b", text).groups()
    return float(number) / {"h": 1, "min": 60, "s": 3600}[unit]


def bars_agree_with_their_numbers(page) -> None:
    """A few seconds of use each: every bar's length is its number's share of the largest, as shown
    (a number rounded to 0.0 beside a full bar said nothing)."""
    rows = page.locator("#usage .usage-user")
    shown = [(shown_hours(rows.nth(i).locator(".value").text_content()),
              rows.nth(i).locator(".fill").evaluate("e => e.getBoundingClientRect().width"),
              rows.nth(i).locator(".track").evaluate("e => e.getBoundingClientRect().width"))
             for i in range(rows.count())]
    most = max(hours for hours, _, _ in shown)
    assert most > 0, shown
    for hours, fill, track in shown:
        assert abs(fill / track - hours / most) < 0.1, shown


def test_without_a_ledger_the_section_says_so(fake_driver, tmp_path, browser):  # noqa: F811
    env = ledger_env(fake_driver, tmp_path, tmp_path / "none.sqlite")
    fake_driver.write()
    argv = [sys.executable, "-m", "gpumon", "serve", "--interval", "0.5", "--listen", "127.0.0.1:0"]
    with Served(argv, env) as served:
        page = browser.new_page()
        page.goto(served.url)
        page.wait_for_selector("#usage:not([hidden])")
        assert "no usage history" in page.locator("#usage-note").text_content()
        page.close()


def test_the_demo_has_no_history_to_show(tmp_path):
    argv = [sys.executable, "-m", "gpumon", "serve", "--demo", "--interval", "0.5", "--listen", "127.0.0.1:0"]
    with Served(argv, None) as served:  # the machine's own ledger is never shown beside the demo's cards
        assert get(served.base + "/api/report")[0] == 404


def test_viewers_asking_at_once_get_one_reading_of_the_ledger(fake_driver, tmp_path):
    """Eight viewers ask for the section at the same moment: the ledger is read once, and all of
    them get that one answer (the same document, made at one time)."""
    from concurrent.futures import ThreadPoolExecutor

    from usage_history import write_v1_ledger

    db = write_v1_ledger(tmp_path / "usage.sqlite")  # a format-1 file: each reading takes a while
    fake_driver.write()
    argv = [sys.executable, "-m", "gpumon", "serve", "--interval", "0.5", "--listen", "127.0.0.1:0"]
    with Served(argv, ledger_env(fake_driver, tmp_path, db)) as served:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: get(served.base + "/api/report"), range(8)))
    assert [status for status, _, _ in answers] == [200] * 8
    assert len({json.loads(body)["time"] for _, _, body in answers}) == 1
