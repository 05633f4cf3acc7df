"""An AMD card whose sysfs read hangs (a hung SMU, a card in a bad state) delays only itself, as a
hung NVIDIA card does: the other cards are read, it is shown "stale" ("not responding for N s")
with its last values, and it comes back when the read returns. The hung read is a FIFO nobody
writes (fakedrm's `hang`): open() blocks, which is what a read the kernel never finishes looks like."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
import threading
import time

from conftest import Card
from fakedrm import RX7900, RX7900_HWMON

from gpumon.cards.backends.drm import DrmBackend
from gpumon.cards.sampler import Sampler


def two_amd_cards(kernel):
    first = kernel.sys.amd()
    second = kernel.sys.amd("0000:43:00.0", files=RX7900, hwmon=RX7900_HWMON, parents=("pci0000:40",))
    return first, second


def test_snapshot_answers_within_timeout_with_the_hung_card_marked(fake_kernel):
    _, second = two_amd_cards(fake_kernel)
    fake_kernel.sys.hang(second, "gpu_busy_percent")
    started = time.monotonic()
    out = fake_kernel.run("snapshot", "--json", "--timeout", "2", timeout=30)
    took = time.monotonic() - started
    assert out.returncode == 0, out.stderr
    assert took < 10, f"took {took:.1f} s"  # 2 s, plus starting Python on a loaded machine
    first, hung = json.loads(out.stdout)["gpus"]
    assert (first["state"], first["utilization_gpu"], first["stale_s"]) == ("ok", 37, None)
    assert hung["state"] == "stale" and hung["stale_s"] >= 1.5
    # What it read before the hung file is not shown as if it were the card's current values.
    assert hung["utilization_gpu"] is None and hung["vendor"] == "amd" and hung["pci_bus_id"] == "00000000:43:00.0"
    text = fake_kernel.run("snapshot", "--timeout", "1", timeout=30).stdout
    assert "GPU 1: not responding for" in text


def test_a_hung_ras_file_delays_only_its_card(fake_kernel):
    """The health counters are sysfs reads too: they are read on the card's lane."""
    first, _ = two_amd_cards(fake_kernel)  # an Instinct card with RAS files, a Radeon without
    fake_kernel.sys.hang(first, "ras/umc_err_count")
    started = time.monotonic()
    out = fake_kernel.run("snapshot", "--json", "--timeout", "2", timeout=30)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 10
    hung, other = json.loads(out.stdout)["gpus"]
    assert hung["state"] == "stale" and hung["stale_s"] >= 1.5
    assert other["state"] == "ok" and other["health"] is not None


def test_a_hung_amd_card_beside_nvidia_ones(fake_driver, fake_kernel):
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", bus="00000000:07:00.0", extra=dict(util=11))]
    fake_driver.write()
    amd = fake_kernel.sys.amd("0000:c3:00.0", parents=("pci0000:c0",))
    fake_kernel.sys.hang(amd, "temp1_input", hwmon=True)
    started = time.monotonic()
    out = fake_kernel.run("snapshot", "--json", "--timeout", "2", env=fake_driver.env, timeout=30)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 10
    nvidia, hung = json.loads(out.stdout)["gpus"]
    assert (nvidia["vendor"], nvidia["state"], nvidia["utilization_gpu"]) == ("nvidia", "ok", 11)
    assert (hung["vendor"], hung["state"]) == ("amd", "stale") and hung["stale_s"] >= 1.5


def test_topo_answers_within_timeout_and_leaves_the_hung_card_out(fake_kernel):
    hive = {"xgmi_hive_info/xgmi_hive_id": "1234567890abcdef"}
    fake_kernel.sys.amd(files={**RX7900, **hive})
    second = fake_kernel.sys.amd("0000:04:00.0", files={**RX7900, **hive})
    fake_kernel.sys.amd("0000:43:00.0", parents=("pci0000:40",))
    fake_kernel.sys.hang(second, "unique_id")  # read with the card's identity, which topo needs (its hive)
    started = time.monotonic()
    out = fake_kernel.run("topo", "--timeout", "2", timeout=30)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 10
    lines = out.stdout.splitlines()
    assert lines[0].split()[:2] == ["GPU0", "GPU2"] and lines[1].split()[:3] == ["GPU0", "X", "NODE"]
    assert "GPU1 left out: not responding" in out.stdout


def test_a_card_that_hangs_mid_run_delays_only_itself_and_comes_back(fake_kernel):
    first, second = two_amd_cards(fake_kernel)
    before = drm_lanes()  # other tests' backends' idle lanes
    backend = DrmBackend(sysfs=str(fake_kernel.sys.root), procfs=str(fake_kernel.proc.root))
    sampler = Sampler(backend, interval=0.3)
    published: list = []
    sampler.subscribe(published.append)
    hung = None
    state: dict[str, float] = {}

    def fresh_since(t: float) -> list:
        return [s for s in published if not s.stale and s.time >= t and s.gpus[1].state == "ok"]

    async def go():
        nonlocal hung
        task = asyncio.create_task(sampler.run())
        try:
            await until(lambda: published and published[-1].gpus[0].state == "ok", "a first sample")
            hung = fake_kernel.sys.hang(first, "power1_average", hwmon=True)
            state["hung_at"] = time.time()
            await until(lambda: published[-1].gpus[0].state == "stale" and published[-1].gpus[0].stale_s >= 3,
                        "the hung card to be marked stale")
            fake_kernel.sys.set(second, "gpu_busy_percent", "64")
            await until(lambda: published[-1].gpus[1].utilization_gpu == 64, "the other card's new value")
            state["healthy_updates"] = len(fresh_since(state["hung_at"]))
            state["lanes"] = drm_lanes() - before
            stale = published[-1].gpus[0]
            state["stale"] = stale
            released = await asyncio.to_thread(hung.release, "150000000")
            assert released, "the card's lane was waiting on the hung file"
            await until(lambda: published[-1].gpus[0].state == "ok", "the card to come back")
        finally:
            sampler.stop()
            await task

    try:
        asyncio.run(go())
    finally:
        if hung is not None and hung.path.is_fifo():
            hung.release("1", timeout=0)  # no lane left stuck on it
    assert state["healthy_updates"] >= 8, f"the healthy card updated {state['healthy_updates']} times"
    stale = state["stale"]
    assert stale.error.startswith("not responding for") and stale.uuid == "GPU-5a2c1e8172f8a8b6"
    assert (stale.temperature, stale.utilization_gpu, stale.power_draw) == (45, 37, 123.0)  # its last values
    back = published[-1].gpus[0]
    assert (back.state, back.error, back.stale_s, back.power_draw) == ("ok", None, None, 150.0)
    assert state["lanes"] == 2, "one lane per card, however long one stays stuck"


def test_the_tui_keeps_drawing_the_other_cards(fake_kernel, tmux_session, tmp_path):
    first, second = two_amd_cards(fake_kernel)
    status = tmp_path / "status"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_kernel.env.items()
                   if k in ("GPUMON_NVML_LIB", "PATH", "HOME", "XDG_CONFIG_HOME", "TZ"))
    paths = " ".join(shlex.quote(a) for a in fake_kernel.paths)
    tmux = tmux_session(140, 40)
    tmux.start(f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon {paths} --interval 0.5; "
               f"echo $? > {status}")
    tmux.wait_for(lambda s: "AMD Instinct MI210" in s and "37%" in s, what="the cards")
    hung = fake_kernel.sys.hang(first, "gpu_busy_percent")
    try:
        tmux.wait_for(lambda s: "not responding for" in s, timeout=30, what="the hung card marked")
        fake_kernel.sys.set(second, "gpu_busy_percent", "64")
        tmux.wait_for(lambda s: "64%" in s, what="the other card's new value")
        assert hung.release("81")
        tmux.wait_for(lambda s: "not responding" not in s and "81%" in s, what="the card back")
    finally:
        if hung.path.is_fifo():
            hung.release("1", timeout=0)
    tmux.keys("q")
    tmux.wait_for(lambda s: status.exists(), what="gpumon to quit")
    assert status.read_text().strip() == "0"


def drm_lanes() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("gpumon-drm-card-"))


async def until(predicate, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, f"waited {seconds} s for {what}"
        await asyncio.sleep(0.05)
