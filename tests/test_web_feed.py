"""One sampler (or one fleet) however many pages are open: 50 Server-Sent Event streams cost the
driver no more calls than one (counted by the fake driver itself), every stream gets every
sample; and the fleet's page over a real sshd, whose ssh children end with the server."""

from __future__ import annotations

import asyncio
import ctypes
import json
import time

import aiohttp
import psutil
from conftest import Card
from test_fleet_headless import _ssh_children
from webpage import Served, get, until

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import Sampler
from gpumon.web.feed import Feed, LocalCards
from gpumon.web.server import WebServer

A100 = "NVIDIA A100-SXM4-40GB"
INTERVAL = 0.25
SECONDS = 3.0
UTIL_CALL = "nvmlDeviceGetUtilizationRates"  # asked once per card per sample


def calls(lib, fn: str) -> int:
    counter = ctypes.CDLL(str(lib)).fakeNvmlCallCount  # the library the backend loaded: one copy
    counter.restype = ctypes.c_ulong
    return counter(fn.encode())


async def _stream(session: aiohttp.ClientSession, url: str, events: list[float], ready: asyncio.Event) -> None:
    async with session.get(url) as response:
        assert response.status == 200 and response.headers["Content-Type"] == "text/event-stream"
        async for line in response.content:
            if line.startswith(b"data: "):
                assert json.loads(line[6:])["hosts"][0]["cards"]  # a whole view each time
                events.append(time.monotonic())
                ready.set()


async def _viewers(port: int, count: int, lib) -> tuple[float, list[int]]:
    """(driver calls per second, events each viewer got) while `count` pages are open."""
    async with aiohttp.ClientSession() as session:
        got: list[list[float]] = [[] for _ in range(count)]
        ready = [asyncio.Event() for _ in range(count)]
        tasks = [asyncio.create_task(_stream(session, f"http://127.0.0.1:{port}/events", got[i], ready[i]))
                 for i in range(count)]
        async with asyncio.timeout(30):
            await asyncio.gather(*(r.wait() for r in ready))
        before, started = calls(lib, UTIL_CALL), time.monotonic()
        await asyncio.sleep(SECONDS)
        rate = (calls(lib, UTIL_CALL) - before) / (time.monotonic() - started)
        counts = [sum(1 for t in events if t >= started) for events in got]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return rate, counts


def test_fifty_viewers_cost_the_driver_no_more_than_one(fake_driver):
    fake_driver.machine.cards = [Card(A100, extra=dict(util="10..90")), Card(A100)]
    fake_driver.write()
    lib = fake_driver.lib
    backend = NvmlBackend(lib_path=str(lib))

    async def main():
        feed = Feed()
        sampler = Sampler(backend, interval=INTERVAL)
        passes: list[float] = []
        sampler.subscribe(lambda snapshot: passes.append(time.monotonic()))
        cards = LocalCards(sampler, feed)
        server = WebServer(cards, feed, "127.0.0.1", 0, token=None)
        port = await server.start()
        reading = asyncio.create_task(cards.run())
        try:
            one = await _viewers(port, 1, lib)
            fifty = await _viewers(port, 50, lib)
            return one, fifty, len(passes), feed.version
        finally:
            cards.stop()
            await server.stop()
            await reading

    try:
        (rate_1, counts_1), (rate_50, counts_50), passes, views = asyncio.run(main())
    finally:
        backend.close()
    expected = 2 / INTERVAL  # two cards, one sample each interval
    assert 0.5 * expected <= rate_1 <= 1.3 * expected, rate_1
    assert rate_50 <= 1.3 * expected and rate_50 <= 1.3 * rate_1 + 2, (rate_1, rate_50)
    assert views == passes  # one view made per sample, whatever the number of viewers
    # Every viewer is served every sample (give or take the first and the last).
    samples = SECONDS / INTERVAL
    assert len(counts_50) == 50 and min(counts_50) >= 0.5 * samples and min(counts_1) >= 0.5 * samples, counts_50


def test_the_fleet_page_and_its_ssh_children_end_with_the_server(ssh_lab):
    for name, cards in (("a", 2), ("b", 1)):
        ssh_lab.host(name).machine.cards = [Card(A100) for _ in range(cards)]
        ssh_lab.hosts[name].write()
    argv = ssh_lab.gpumon_argv("serve", "--listen", "127.0.0.1:0", "--hosts", "a,b,nowhere.invalid",
                               "--interval", "0.5")
    served = Served(argv, ssh_lab.env())
    try:
        def fleet_read():
            status, _, body = get(served.base + "/api/snapshot")
            doc = json.loads(body) if status == 200 else {}
            states = {h["host"]: h["state"] for h in doc.get("hosts", [])}
            return doc if states.get("a") == states.get("b") == "ok" and states.get("nowhere.invalid") else None

        doc = until(fleet_read, 60, "both hosts' cards")
        assert [len(h["snapshot"]["gpus"]) for h in doc["hosts"][:2]] == [2, 1]
        assert doc["hosts"][2]["state"] == "unreachable" and doc["hosts"][2]["snapshot"] is None
        status, _, body = get(served.base + "/api/health")
        health = json.loads(body)
        assert status == 200 and [h["verdict"] for h in health["hosts"]] == ["ok", "ok", "fail"]
        children = until(lambda: len(_ssh_children(served.proc.pid)) >= 2 and _ssh_children(served.proc.pid),
                         what="an ssh client per host")
    finally:
        status, errors = served.stop()
    assert status == 0 and "Traceback" not in errors, errors
    assert not psutil.wait_procs(children, timeout=15)[1], "ssh clients left running"


def test_the_page_of_a_fleet_says_how_many_cards_are_free_where(ssh_lab):
    for name, util in (("a", 0), ("b", 95), ("c", 0)):
        ssh_lab.host(name).machine.cards = [Card(A100, extra=dict(util=util, mem_used=0)) for _ in range(2)]
        ssh_lab.hosts[name].write()
    argv = ssh_lab.gpumon_argv("serve", "--listen", "127.0.0.1:0", "--hosts", "a,b,c", "--interval", "0.5")
    with Served(argv, ssh_lab.env()) as served:
        async def first_view_with_every_host():
            async with aiohttp.ClientSession() as session, session.get(served.base + "/events") as response:
                async for line in response.content:
                    if line.startswith(b"data: "):
                        view = json.loads(line[6:])
                        if all(h["cards"] for h in view["hosts"]):
                            return view

        view = asyncio.run(asyncio.wait_for(first_view_with_every_host(), 60))
    assert view["summary"]["text"] == "4 cards free on 2 hosts (of 6 cards on 3 hosts)"
    assert [c["id"] for h in view["hosts"] for c in h["cards"]] == ["a:0", "a:1", "b:0", "b:1", "c:0", "c:1"]
