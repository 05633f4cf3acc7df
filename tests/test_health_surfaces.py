"""Card health on every surface, through the real program: `watch` alert rules and hooks, the
exporter scraped and its rules checked by promtool, `health --hosts` over a real sshd, the
Prometheus source reading a real Prometheus, the TUI's panels and its `h` screen, and documents
from other hosts checked before they are trusted."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request

import pytest
from conftest import Card, FakeDriver, require_tool
from promlab import Exporter, Prometheus, StaticServer, scrape_job, wait_until
from textual.geometry import Region

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.fleet.schema import SchemaError, snapshot_from_remote
from gpumon.tui.app import create_app
from gpumon.tui.screens.health import HealthScreen
from gpumon.tui.widgets.gpu_panel import GpuPanel

A100 = "NVIDIA A100-SXM4-80GB"
REMAPS = dict(remap_cor=0, remap_unc=0, remap_pending=0, remap_failure=0)


def events_of(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def read_every(tmp_path, interval: str = "1s") -> str:
    """A config that reads the health counters this often (30 s by default)."""
    config = tmp_path / "every.toml"
    config.write_text(f'[health]\ninterval = "{interval}"\n')
    return str(config)


def test_watch_health_rule_fires_with_reasons_and_hooks_get_them(fake_driver, tmp_path):
    """A pending remap appearing on card 0 4 s after the machine is described (watch takes ~2 s to
    start on a busy machine); an XID 79 on card 1 1 s after watch starts, then the card lost."""
    m = fake_driver.machine
    m.cards = [Card(A100, extra={**REMAPS, "remap_pending_after": 4}), Card(A100, extra=dict(lost_after=4))]
    m.xids = [dict(gpu=1, at=1.0, code=79)]
    fake_driver.write()
    hook_out = tmp_path / "reasons"
    result = fake_driver.run("watch", "--alert", "health", "--interval", "0.5", "--count", "24",
                             "--config", read_every(tmp_path),
                             "--on-alert", f'printf "%s|%s\\n" "$GPUMON_GPU" "$GPUMON_REASONS" >> {hook_out}',
                             timeout=90)
    assert result.returncode == 0, result.stderr
    events = events_of(result.stdout)
    assert [(e["event"], e["gpu"], e["metric"]) for e in events] == [("firing", 1, "health"), ("firing", 0, "health")]
    xid, remap = events
    assert xid["value"] == 2 and [r["code"] for r in xid["reasons"]] == ["xid_79"]
    assert "fell off the bus" in xid["reasons"][0]["text"] and "reset" in xid["reasons"][0]["action"]
    assert [r["code"] for r in remap["reasons"]] == ["remap_pending"]
    hooked = hook_out.read_text()
    assert "1|xid_79: XID 79 (fell off the bus)" in hooked
    assert "0|remap_pending: a row remap is pending" in hooked and "-> reset the card to apply" in hooked


def test_watch_counter_rules(fake_driver, tmp_path):
    fake_driver.machine.cards = [Card(A100, extra={**REMAPS, "pcie_replay": "0+1/s", "mem_temp": 93,
                                                   "remap_pending": 1}),
                                 Card(A100, extra={**REMAPS, "pcie_replay": 5, "mem_temp": 60})]
    fake_driver.write()
    result = fake_driver.run("watch", "--alert", "pcie_replay_rate > 10/min", "--alert", "mem_temp > 90",
                             "--alert", "remap_pending", "--interval", "0.5", "--count", "14",
                             "--config", read_every(tmp_path, "2s"), timeout=90)
    assert result.returncode == 0, result.stderr
    fired = {(e["metric"], e["gpu"]) for e in events_of(result.stdout) if e["event"] == "firing"}
    assert fired == {("pcie_replay_rate", 0), ("mem_temp", 0), ("remap_pending", 0)}
    rate = next(e for e in events_of(result.stdout) if e["metric"] == "pcie_replay_rate")
    assert rate["value"] == pytest.approx(1.0, rel=0.3) and rate["threshold"] == pytest.approx(10 / 60)
    bad = fake_driver.run("watch", "--alert", "pcie_replay_rate > 10")  # a rate without its unit
    assert bad.returncode == 2 and bad.stdout == "" and "expected a rate like 10/min" in bad.stderr


def test_exporter_has_dcgm_exporter_names_and_the_verdict(fake_driver, tmp_path):
    m = fake_driver.machine
    m.cards = [Card(A100, extra={**REMAPS, "remap_pending": 1, "remap_cor": 4, "mem_temp": 70, "pcie_replay": 9,
                                 "energy_mj": 5000, "ecc_corrected": 3, "gpm": 1, "gpm_sm": 50}),
               Card("Tesla V100-SXM2-32GB", extra=dict(retired_sbe=2, retired_dbe=0, retired_pending=0))]
    fake_driver.write()
    exporter = Exporter({**fake_driver.env, "GPUMON_CONFIG": read_every(tmp_path)}, "node-1").start()
    try:
        def scraped() -> str | None:
            with urllib.request.urlopen(f"http://{exporter.target}/metrics", timeout=5) as answer:
                text = answer.read().decode()
            return text if "gpumon_gpu_health{" in text and "DCGM_FI_PROF_SM_ACTIVE{" in text else None

        text = wait_until(scraped, 30, "the health metrics")
    finally:
        exporter.stop()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            card = "/1" if 'gpu="1"' in name_labels else "/0"
            values[name_labels.split("{")[0] + card] = (name_labels, float(value))
    assert values["DCGM_FI_DEV_ROW_REMAP_PENDING/0"][1] == 1
    assert values["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS/0"][1] == 4
    assert values["DCGM_FI_DEV_MEMORY_TEMP/0"][1] == 70
    assert values["DCGM_FI_DEV_PCIE_REPLAY_COUNTER/0"][1] == 9
    assert values["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION/0"][1] >= 5000  # mJ, as dcgm-exporter
    assert values["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL/0"][1] == 3
    assert values["DCGM_FI_PROF_SM_ACTIVE/0"][1] == pytest.approx(0.5)  # a ratio, as dcgm-exporter
    assert values["DCGM_FI_DEV_RETIRED_SBE/1"][1] == 2
    health0, health1 = values["gpumon_gpu_health/0"], values["gpumon_gpu_health/1"]
    assert health0[1] == 2 and 'reason="remap_pending"' in health0[0]
    assert health1[1] == 0 and 'reason=""' in health1[0]
    assert "DCGM_FI_DEV_MEMORY_TEMP/1" not in values  # the V100 has no memory sensor here: no sample, not 0


CARD = "max without (hpc_job, pod, namespace, container) "  # an exported rule is about the card, whoever holds it


def test_exported_health_rules_pass_promtool(tmp_path):
    promtool = require_tool("promtool")
    rules = ["health", "health fail on 0", "remap_pending", "mem_temp > 90", "pcie_replay_rate > 10/min",
             "correctable_remaps > 0"]
    args = [arg for rule in rules for arg in ("--alert", rule)]
    out = subprocess.run([sys.executable, "-m", "gpumon", "alerts", "export", "--prometheus-rules", *args],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert f'"{CARD}(gpumon_gpu_health >= 1)"' in out.stdout
    assert f'"{CARD}(gpumon_gpu_health{{gpu=~\\"0\\"}} >= 2)"' in out.stdout
    assert "rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[5m]) > 0.166667" in out.stdout
    path = tmp_path / "rules.yml"
    path.write_text(out.stdout)
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_health_across_hosts_over_ssh(ssh_lab):
    good = ssh_lab.host("good")
    good.machine.cards = [Card(A100, extra=REMAPS)]
    good.write()
    bad = ssh_lab.host("bad")
    bad.machine.cards = [Card(A100, extra=REMAPS), Card(A100, extra={**REMAPS, "remap_failure": 1})]
    bad.write()
    result = ssh_lab.gpumon("health", "--hosts", "good,bad")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # Each host is printed as it answers, so the hosts come in either order; a host's cards stay together.
    rows = [line.split()[:3] for line in lines]
    assert sorted(rows) == [["GPU", "bad:0", "ok"], ["GPU", "bad:1", "FAIL"], ["GPU", "good:0", "ok"]]
    bad_rows = [i for i, row in enumerate(rows) if row[1].startswith("bad:")]
    assert bad_rows[1] == bad_rows[0] + 1 and rows[bad_rows[0]][1] == "bad:0"
    failed = lines[bad_rows[1]]
    assert "remap_failure" in failed and "RMA" in failed
    doc = json.loads(ssh_lab.gpumon("health", "--json", "--hosts", "good,bad,nowhere.invalid").stdout)
    verdicts = {h["host"]: h["verdict"] for h in doc["hosts"]}
    assert verdicts == {"good": "ok", "bad": "fail", "nowhere.invalid": "fail"}  # unreachable cannot vouch
    assert doc["hosts"][1]["gpus"][1]["remapped_rows_failure"] is True
    just_good = ssh_lab.gpumon("health", "--hosts", "good")
    assert just_good.returncode == 0, just_good.stdout + just_good.stderr


DCGM_LABELS = 'UUID="GPU-d{i}",device="nvidia{i}",modelName="NVIDIA H100 80GB HBM3",Hostname="dcgm-node"'
# A dcgm-exporter's exposition, in its format: card 1's row remapping failed; card 0 has no memory
# sensor (DCGM's blank for a 64-bit field).
DCGM_EXPOSITION = "".join(
    f"# TYPE {name} gauge\n"
    + "".join(f'{name}{{gpu="{i}",{DCGM_LABELS.format(i=i)}}} {v}\n' for i, v in enumerate(values))
    for name, values in (("DCGM_FI_DEV_GPU_TEMP", (40, 41)), ("DCGM_FI_DEV_FB_USED", (1, 1)),
                         ("DCGM_FI_DEV_ROW_REMAP_FAILURE", (0, 1)),
                         ("DCGM_FI_DEV_MEMORY_TEMP", (9223372036854775794, 66))))


def test_prometheus_source_reads_the_verdicts_back(fake_lib, tmp_path):
    """A gpumon exporter whose card warns (its verdict comes through) and a dcgm-exporter whose
    card's row remapping failed (judged here from the counter), through a real Prometheus."""
    prometheus = require_tool("prometheus")
    driver = FakeDriver(fake_lib, tmp_path / "fake-nvml.conf")
    driver.machine.cards = [Card(A100, extra={**REMAPS, "pcie_replay": "0+5/s"}), Card(A100, extra=REMAPS)]
    driver.write()
    things: list = []
    try:
        things.append(Exporter({**driver.env, "GPUMON_CONFIG": read_every(tmp_path)}, "gpumon-node").start())
        static = StaticServer()
        things.append(static)
        static.page("/metrics", DCGM_EXPOSITION)
        server = Prometheus(prometheus, tmp_path, [scrape_job("gpumon", [things[0].target]),
                                                   scrape_job("dcgm", [f"127.0.0.1:{static.port}"])])
        things.append(server.start())
        server.wait_for_series("gpumon_gpu_health == 1", 1, timeout=90)  # the replays climbing, judged on the host
        server.wait_for_series('DCGM_FI_DEV_ROW_REMAP_FAILURE{job="dcgm"}', 2)
        result = subprocess.run([sys.executable, "-m", "gpumon", "health", "--json", "--prometheus-url", server.url],
                                capture_output=True, text=True, timeout=60)
    finally:
        for thing in reversed(things):
            (thing.close if isinstance(thing, StaticServer) else thing.stop)()
    assert result.returncode == 2, result.stdout + result.stderr
    hosts = {h["host"]: h for h in json.loads(result.stdout)["hosts"]}
    assert hosts["gpumon-node"]["verdict"] == "warn" and hosts["dcgm-node"]["verdict"] == "fail"
    warned = hosts["gpumon-node"]["gpus"][0]["health"]
    assert warned["verdict"] == "warn" and [r["code"] for r in warned["reasons"]] == ["reported"]
    ok, failed = hosts["dcgm-node"]["gpus"]
    assert ok["health"]["verdict"] == "ok" and ok["memory_temperature"] is None  # DCGM's blank: no reading
    assert [r["code"] for r in failed["health"]["reasons"]] == ["remap_failure"]
    assert failed["remapped_rows_failure"] is True and failed["memory_temperature"] == 66


# -- the TUI --

def test_tui_shows_the_verdict_on_the_card_and_h_tells_why(fake_driver):
    m = fake_driver.machine
    m.cards = [Card(A100, extra=REMAPS), Card(A100, extra={**REMAPS, "remap_pending": 1}),
               Card(A100, extra=dict(mem_temp=93, mem_temp_max=95))]
    fake_driver.write()

    async def go(size: tuple[int, int]) -> None:
        backend = NvmlBackend(lib_path=str(fake_driver.lib))
        app = create_app(backend, interval=0.2)
        async with app.run_test(size=size) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.pause(0.5)
            panels = app.main_screen.query(GpuPanel)
            width = panels.first().size.width - 2
            rows = [p.lines(width) for p in panels]
            first = [lines[0].plain for lines in rows]
            assert "FAIL" not in first[0] and "WARN" not in first[0] and " ok" not in first[0]
            assert first[1].rstrip().endswith("FAIL") or " FAIL" in first[1]
            assert " WARN" in first[2]
            title = rows[1][0]
            assert any(title.plain[s.start:s.end].strip() == "FAIL" and str(s.style) for s in title.spans)  # coloured
            if panels.first().compact:  # one line a card: every column where the others have it
                assert len({line.index("▕") for line in first}) == 1
                assert len({line.index("%") for line in first}) == 1
            await pilot.press("j", "h")
            await pilot.pause(0.3)
            screen = app.screen
            assert isinstance(screen, HealthScreen) and screen.gpu.index == 1
            shown = " ".join(strip.text for static in screen.query("Static")
                             for strip in static.render_lines(Region(0, 0, *static.size)))
            assert "FAIL" in shown and "a row remap is pending" in shown
            assert "reset the card to apply pending row remaps" in shown
            assert "Row remap pending" in shown and "Memory temperature" in shown
            await pilot.press("escape")
            await pilot.pause(0.2)
            assert not isinstance(app.screen, HealthScreen)

    asyncio.run(go((120, 40)))
    asyncio.run(go((80, 24)))


# -- documents from other hosts --

def test_remote_health_is_checked_and_made_printable():
    card = {"index": 0, "uuid": "GPU-x", "name": "n", "state": "ok", "processes": [],
            "remapped_rows_pending": True, "pcie_replay_rate": 0.5, "energy_j": 12.5, "energy_source": "driver",
            "clock_event_s": {"sw_power_cap": 1.5},
            "health": {"verdict": "fail", "reasons": [
                {"code": "remap_pending", "text": "bad \x1b[31m[red]row[/red]", "action": "reset\u202e it"}]}}
    doc = {"schema": 1, "time": 1.0, "host": "h", "backend": "nvml", "gpus": [card]}
    gpu = snapshot_from_remote(doc).gpus[0]
    assert gpu.health.verdict == "fail" and gpu.counters.remapped_rows_pending is True
    assert gpu.counters.clock_event_s == (1.5, None, None, None, None)
    reason = gpu.health.reasons[0]
    assert "\x1b" not in reason.text and "\u202e" not in reason.action and "[red]" in reason.text
    for field, value in (("health", {"verdict": "doomed"}), ("remapped_rows_pending", 1),
                         ("pcie_replay_rate", "fast"), ("health", {"verdict": "ok", "reasons": ["x"] * 40})):
        with pytest.raises(SchemaError):
            snapshot_from_remote({**doc, "gpus": [{**card, field: value}]})


def test_demo_cards_have_health(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gpumon", "--demo", "hot", "health", "--json"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode in (0, 1), out.stderr  # the hot card's memory nears its maximum as it heats up
    gpus = json.loads(out.stdout)["gpus"]
    assert gpus[0]["memory_temperature_max"] == 95 and gpus[0]["energy_source"] == "driver"
    assert gpus[0]["sm_active"] is not None  # H100: GPM

