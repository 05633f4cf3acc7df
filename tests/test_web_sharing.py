"""The web page shows who shares each card: claims, reservations (with the holder's note as text,
never HTML) and the host's queue, in a real browser."""

from __future__ import annotations

from conftest import GIB, Card
from test_claims import jobs
from test_web_page import serve
from webpage import browser  # noqa: F401 - browser is a fixture

NOTE = '<img src=x onerror="document.title=1">[b]deadline[/b]'


def test_claims_reservations_and_the_queue_on_the_page(fake_driver, browser):  # noqa: F811
    fake_driver.machine.cards = [
        Card("NVIDIA A40", uuid=f"GPU-{i}{i}{i}{i}ffff-1111-2222-3333-44445555666{i}",
             bus=f"00000000:{0x61 + i:02X}:00.0", mem_total=48 * GIB,
             extra=dict(mem_used=(40 if i == 2 else 1) * GIB, util=90 if i == 2 else 0))
        for i in range(3)]
    fake_driver.write()
    try:
        assert fake_driver.run("reserve", "--gpu", "0", "--for", "1h", "--note", NOTE).returncode == 0
        assert fake_driver.run("run", "--gpu", "1", "--name", "<b>train</b>", "--", "sleep", "60").returncode == 0
        assert fake_driver.run("run", "--wait", "--gpu", "2", "--name", "later", "--", "true").returncode == 0
        with serve(fake_driver) as served:
            page = browser.new_page()
            page.goto(served.url)
            page.wait_for_selector('[data-card="1"] .claim')
            assert page.locator('[data-card="1"] .claim').text_content().startswith("claimed by root: job ")
            assert "<b>train</b>" in page.locator('[data-card="1"] .claim').text_content()
            assert page.locator('[data-card="1"]').get_attribute("data-free") == "no"
            reserved = page.locator('[data-card="0"] .reservation').text_content()
            assert reserved.startswith("reserved by root until ") and NOTE in reserved
            assert page.locator("img").count() == 0 and page.title() == "gpumon"
            assert NOTE in page.locator("#users-reserved li").first.text_content()
            entry = page.locator(".queue-list li").first.text_content()
            assert entry.startswith("root: job ") and "later wants 2" in entry
    finally:
        for job in jobs(fake_driver):
            if job["state"] in ("running", "queued"):
                fake_driver.run("jobs", "--stop", job["id"])


def test_a_poisoned_place_leaves_the_page_and_its_api_answering(fake_driver):
    """Records no parser survives, planted by another user: the page's documents still answer 200,
    and the stream the page reads keeps coming."""
    import json
    import os
    from pathlib import Path

    from test_web_access import get

    uuid = "GPU-0000ffff-1111-2222-3333-444455556660"
    fake_driver.machine.cards = [Card("NVIDIA A40", uuid=uuid, mem_total=48 * GIB)]
    fake_driver.write()
    place = Path(fake_driver.env["GPUMON_CLAIMS_DIR"])
    place.mkdir(mode=0o1777, exist_ok=True)
    for kind, body in {"deep": b'{"card": "%s", "x": ' % uuid.encode() + b"[" * 1900 + b"]" * 1900 + b"}",
                       "nan": b'{"card": "%s", "until": NaN, "created": NaN}' % uuid.encode(),
                       "huge": b'{"card": "%s", "until": 1%s, "created": 1}' % (uuid.encode(), b"0" * 400)}.items():
        (place / f"reserve.{kind}.0000").write_bytes(body)
        os.chown(place / f"reserve.{kind}.0000", 65534, 65534)
    with serve(fake_driver) as served:
        for path in ("/api/snapshot", "/api/users"):
            status, _, body = get(f"{served.base}{path}?token={served.token}")
            assert status == 200, (path, body[:200])
        doc = json.loads(get(f"{served.base}/api/snapshot?token={served.token}")[2])
        assert doc["gpus"][0]["reservation"] is None and doc["gpus"][0]["claims"] == []
