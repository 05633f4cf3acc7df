"""`gpumon report --prometheus-url`: the same report from a real Prometheus (tests/promlab.py)
scraping a real `gpumon watch --prometheus --prometheus-processes` over the fake driver, whose
cards list two real users' processes (tests/usage_lab.py): one computing, one holding its card idle."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import GIB, Card, require_tool
from promlab import Exporter, Prometheus, scrape_job, wait_until
from usage_lab import two_users  # noqa: F401 - the fixture


def test_a_prometheus_answers_the_report_for_its_users_and_cards(fake_driver, tmp_path, two_users):  # noqa: F811
    a, b = two_users.names
    busy, idle = two_users.spawn(a), two_users.spawn(b)
    fake_driver.machine.cards = [Card(extra={"power_mw": 200_000, "util": 80}),
                                 Card(extra={"power_mw": 50_000, "util": 0})]
    fake_driver.machine.procs = [dict(gpu=0, pid=busy, mem=4 * GIB, sm=80), dict(gpu=1, pid=idle, mem=2 * GIB, sm=0)]
    fake_driver.write()
    exporter = Exporter(fake_driver.env, "node1", processes=True).start()
    server = Prometheus(require_tool("prometheus"), tmp_path, [scrape_job("gpumon", [exporter.target])]).start()
    try:
        began = time.time()
        wait_until(lambda: any(float(s["value"][1]) >= 8 for s in server.query(
            "count_over_time(gpumon_process_gpu_memory_bytes[5m])")), 60, "8 scrapes of the processes")
        out = subprocess.run([sys.executable, "-m", "gpumon", "report", "--json", "--since", "5m",
                              "--prometheus-url", server.url], capture_output=True, text=True, timeout=60)
        seen = time.time() - began + 5
    finally:
        server.stop()
        exporter.stop()
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["source"] == "prometheus"
    users = {r["id"]: r for r in doc["rows"] if r["kind"] == "user"}
    assert set(users) == {a, b} and all(r["host"] == "node1" for r in users.values())
    for row in users.values():  # held from the first scrape that listed it: within what Prometheus saw
        assert 5.0 / 3600 <= row["gpu_hours"] <= seen / 3600
    assert users[a]["mean_sm"] == pytest.approx(80) and users[a]["idle_hours"] == 0
    assert users[b]["mean_sm"] == 0 and users[b]["idle_hours"] == pytest.approx(users[b]["gpu_hours"])
    assert users[a]["peak_memory"] == 4 * GIB
    assert users[a]["energy_kwh"] == pytest.approx(200 * users[a]["gpu_hours"] / 1000, rel=0.05)
    cards = {c["index"]: c for c in doc["cards"]}
    assert cards[0]["mean_util"] == pytest.approx(80) and cards[1]["mean_util"] == 0
    assert cards[0]["last_used"] is not None and cards[1]["last_used"] is None
    assert {d["index"] for d in doc["days"]} == {0, 1}


def test_a_prometheus_that_cannot_be_read_is_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpumon", "report", "--prometheus-url", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "127.0.0.1:9" in out.stderr
    by_card = subprocess.run([sys.executable, "-m", "gpumon", "report", "--by", "card", "--prometheus-url",
                              "http://127.0.0.1:9"], capture_output=True, text=True, timeout=60)
    assert by_card.returncode == 2 and "--by card with --prometheus-url" in by_card.stderr
