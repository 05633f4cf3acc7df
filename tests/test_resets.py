"""Resets, driver reloads and live MIG, on the fake driver: a lost card comes back under its UUID,
a reloaded driver is initialised again, MIG slices are re-read, and cards that fail while being
opened (or that the driver cannot even count) are reported, never a crash."""

from __future__ import annotations

import json
import time

import pytest
from conftest import GIB, Card

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.cards.sampler import sample_once


@pytest.fixture
def backend(fake_driver):
    opened: list[NvmlBackend] = []

    def _open() -> NvmlBackend:
        fake_driver.write()
        opened.append(NvmlBackend(lib_path=str(fake_driver.lib)))
        return opened[-1]

    yield _open
    for b in opened:
        b.close()


def until(predicate, timeout: float = 20.0, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def test_a_lost_card_comes_back_under_its_uuid_in_watch(fake_driver):
    fake_driver.machine.cards = [Card(), Card(extra=dict(lost_after=1.0, back_after=3.0)), Card()]
    fake_driver.write()
    uuid = fake_driver.machine.cards[1].line(1).split("uuid=")[1].split()[0]
    out = fake_driver.run("watch", "--alert", "lost", "--interval", "0.3", "--count", "40", "--metrics")
    assert out.returncode == 0, out.stderr
    events = [e for e in map(json.loads, out.stdout.splitlines()) if e["event"] in ("firing", "resolved")]
    assert [(e["event"], e["gpu"], e["uuid"]) for e in events] == [("firing", 1, uuid), ("resolved", 1, uuid)]


def test_a_lost_card_comes_back_in_the_backend(fake_driver, backend):
    fake_driver.machine.cards = [Card(extra=dict(util=20)), Card(extra=dict(util=40, lost_after=0.5, back_after=2.0))]
    b = backend()
    first = b.sample()
    assert [g.state for g in first.gpus] == ["ok", "ok"]
    assert until(lambda: b.sample().gpus[1].state == "lost", 5)
    back = until(lambda: (s := b.sample()).gpus[1].state == "ok" and s, 15)
    assert back, "the card answers again after its reset"
    assert back.gpus[1].uuid == first.gpus[1].uuid and back.gpus[1].utilization_gpu == 40


def test_watch_survives_a_driver_reload(fake_driver, backend):
    fake_driver.machine.cards = [Card(extra=dict(util=20)), Card(extra=dict(util=40))]
    b = backend()
    assert [g.state for g in b.sample().gpus] == ["ok", "ok"]
    fake_driver.machine.driver_unloaded = True  # `rmmod nvidia`: every call fails
    fake_driver.write()
    gone = until(lambda: (s := b.sample()).gpus[0].state == "error" and s, 5)
    assert gone and "driver" in gone.gpus[0].error.lower()
    time.sleep(1.5)
    assert b.sample().gpus[1].state == "error"  # still gone: retried with backoff, never a crash
    fake_driver.machine.driver_unloaded = False  # `modprobe nvidia`: the old NVML session is gone
    fake_driver.machine.cards[1].extra["util"] = 44
    fake_driver.machine.xids = [dict(gpu=1, at=1.0, code=79)]  # counted from the new nvmlInit
    fake_driver.write()
    back = until(lambda: (s := b.sample()).gpus[1].state == "ok" and s, 20)
    assert back and back.gpus[1].utilization_gpu == 44
    # XID events are registered again on the new session.
    got = until(lambda: b.wait_xid(0.5), 10, step=0)
    assert got == [(1, 79)]


def test_mig_slices_created_and_destroyed_at_run_time(fake_driver, backend, monkeypatch):
    from gpumon.cards.backends.nvml import opening

    monkeypatch.setattr(opening, "SLOW_STATE_S", 0.5)  # 10 s in real life
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", mem_total=80 * GIB, extra=dict(mig=2)), Card()]
    b = backend()
    first = b.sample().gpus[0]
    assert first.mig_mode is True and len(first.mig_devices) == 2
    fake_driver.machine.cards[0].extra["mig"] = 3  # `nvidia-smi mig -cgi …`
    fake_driver.write()
    assert until(lambda: len(b.sample().gpus[0].mig_devices) == 3, 10)
    fake_driver.machine.cards[0].extra["mig"] = 1  # `nvidia-smi mig -dgi …`: handles go stale
    fake_driver.write()
    now = until(lambda: (g := b.sample().gpus[0]) and len(g.mig_devices) == 1 and g, 10)
    assert now and now.state == "ok" and now.mig_devices[0].memory_total == 80 * GIB


def test_a_destroyed_slice_is_dropped_at_once(fake_driver, backend):
    # No waiting for the slow timer: the failing handle makes the slices be read again.
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", mem_total=80 * GIB, extra=dict(mig=2))]
    b = backend()
    assert len(b.sample().gpus[0].mig_devices) == 2
    fake_driver.machine.cards[0].extra["mig"] = 1
    fake_driver.write()
    time.sleep(0.2)
    b.sample()
    gpu = b.sample().gpus[0]
    assert len(gpu.mig_devices) == 1 and gpu.mig_devices[0].memory_total is not None


def mig_machine(machine) -> None:
    machine.cards = [
        Card("NVIDIA A100-SXM4-80GB", mem_total=80 * GIB, extra=dict(mig=2, mig_used=f"{30 * GIB},0", util=0)),
        Card("NVIDIA A100-SXM4-80GB", mem_total=80 * GIB, extra=dict(util=95, mem_used=70 * GIB)),
    ]


def test_select_offers_a_free_mig_slice_never_the_whole_card(fake_driver):
    mig_machine(fake_driver.machine)
    fake_driver.write()
    out = fake_driver.run("select", "--verbose")
    assert out.returncode == 0, out.stderr
    chosen = out.stdout.strip()
    assert chosen.startswith("MIG-") and chosen.endswith("-0001-0000-0000-000000000000"), chosen  # slice 1 is free
    assert "GPU 0 is in MIG mode: 1 of 2 slices free" in out.stderr
    two = fake_driver.run("select", "--count", "2", "--verbose")
    assert two.returncode == 1 and "GPU 0 skipped: in MIG mode" in two.stderr


def test_a_card_that_fails_while_being_opened_is_an_error_not_a_crash(fake_driver):
    fake_driver.machine.cards = [Card(extra=dict(util=11)), Card(extra=dict(fail="cpu_affinity:15")),
                                 Card(extra=dict(fail="numa:15,mig:15"))]
    fake_driver.write()
    out = fake_driver.run("snapshot", "--json")
    assert out.returncode == 0, out.stderr
    gpus = json.loads(out.stdout)["gpus"]
    assert [g["state"] for g in gpus] == ["ok", "lost", "lost"]
    assert gpus[0]["utilization_gpu"] == 11
    assert fake_driver.run("snapshot").returncode == 0


def test_count_failure_is_exit_3_with_the_reason(fake_driver):
    fake_driver.machine.cards = [Card()]
    fake_driver.machine.count_error = 999
    fake_driver.write()
    for command in (["snapshot"], ["watch", "--count", "1"], ["select"], ["topo"]):
        out = fake_driver.run(*command)
        assert out.returncode == 3, (command, out.stderr)
        assert "nvmlDeviceGetCount" in out.stderr and "Unknown Error" in out.stderr and "Traceback" not in out.stderr


def test_a_card_lost_from_the_start_has_null_ids_and_topo_says_it_left_it_out(fake_driver):
    fake_driver.machine.cards = [Card(), Card(extra=dict(handle_error=15)), Card()]
    fake_driver.write()
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    lost = doc["gpus"][1]
    assert lost["state"] == "lost" and lost["uuid"] is None and lost["pci_bus_id"] is None
    assert doc["gpus"][0]["uuid"].startswith("GPU-")
    topo = fake_driver.run("topo")
    assert topo.returncode == 0
    assert "GPU1 left out: GPU is lost" in topo.stdout
    header = topo.stdout.splitlines()[0].split()
    assert header[:2] == ["GPU0", "GPU2"]
    topo_json = json.loads(fake_driver.run("topo", "--json").stdout)
    assert [g["index"] for g in topo_json["gpus"]] == [0, 2]
    assert topo_json["left_out"][0]["index"] == 1 and "lost" in topo_json["left_out"][0]["reason"]


def test_card_lost_in_the_tui_comes_back(fake_driver, backend):
    # The history of a card that comes back continues under its UUID.
    from gpumon.cards.sampler import History

    fake_driver.machine.cards = [Card(extra=dict(util=30, lost_after=0.3, back_after=1.0))]
    b = backend()
    history = History(capacity=200)
    history.add(sample_once(b))
    until(lambda: history.add(s := b.sample()) or s.gpus[0].state == "lost", 5)
    until(lambda: history.add(s := b.sample()) or s.gpus[0].state == "ok", 15)
    uuid = b.sample().gpus[0].uuid
    _, values = history.series(uuid, "util")
    assert values[0] == 30 and None in values and values[-1] == 30


def test_a_watch_service_survives_a_driver_reload(fake_driver):
    import subprocess
    import sys
    import threading

    fake_driver.machine.cards = [Card(extra=dict(util=20))]
    fake_driver.write()
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "watch", "--metrics", "--interval", "0.3"],
                             env=fake_driver.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    states: list[str] = []

    def read() -> None:
        for line in watch.stdout:
            event = json.loads(line)
            if event["event"] == "sample":
                states.append(event["gpus"][0]["state"])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert until(lambda: "ok" in states, 15)
        fake_driver.machine.driver_unloaded = True
        fake_driver.write()
        assert until(lambda: states[-1] == "error", 10)
        fake_driver.machine.driver_unloaded = False
        fake_driver.write()
        assert until(lambda: states[-1] == "ok", 30), states[-5:]
        assert watch.poll() is None, "watch kept running through the reload"
    finally:
        watch.terminate()
        watch.wait(10)
        reader.join(5)
