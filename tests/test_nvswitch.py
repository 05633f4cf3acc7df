"""NVSwitch boards (HGX/DGX): links through the switch fabric read as NV<links> like `nvidia-smi
topo -m`, placement uses them, and a fabric that is not ready is shown, reported and alerted on."""

from __future__ import annotations

import asyncio
import json

import pytest
from conftest import GIB, Card, require_tool
from test_topology import eight_cards

from gpumon.cards.backends.nvml import NvmlBackend
from gpumon.tui.app import create_app
from gpumon.tui.widgets.card_list import CardList


def hgx(machine, links: int = 18, name: str = "NVIDIA H100 80GB HBM3", **extra) -> None:
    """An 8-card HGX board: two sockets of PCIe switches, every NVLink to one of four NVSwitches."""
    eight_cards(machine)
    machine.nvlinks = []
    for card in machine.cards:
        card.name = name
        card.extra.update(switch_links=links, **extra)


@pytest.mark.parametrize(("links", "name"), [(18, "NVIDIA H100 80GB HBM3"), (12, "NVIDIA A100-SXM4-80GB")])
def test_switch_connected_pairs_read_nv_links_like_nvidia_smi(fake_driver, links, name):
    hgx(fake_driver.machine, links, name)
    fake_driver.write()
    out = fake_driver.run("topo")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()[1:9]]
    for i, row in enumerate(rows):
        assert row[1:9] == ["X" if i == j else f"NV{links}" for j in range(8)], f"row {i}: {row}"
    doc = json.loads(fake_driver.run("topo", "--json").stdout)
    assert all(gpu["nvswitch"] for gpu in doc["gpus"])
    assert doc["gpus"][0]["nvlinks"] == {str(j): links for j in range(1, 8)}


def test_separate_nvlink_domains_fall_back_to_pcie(fake_driver):
    # Two baseboards (or fabric partitions): NVLink only within each.
    hgx(fake_driver.machine)
    for i, card in enumerate(fake_driver.machine.cards):
        card.extra["nvdomain"] = i // 4
    fake_driver.write()
    doc = json.loads(fake_driver.run("topo", "--json").stdout)
    links = doc["gpus"][0]["links"]
    assert [links[str(j)] for j in range(8)] == ["X", "NV18", "NV18", "NV18", "SYS", "SYS", "SYS", "SYS"]


@pytest.mark.parametrize("omit", [("nvmlDeviceGetNvLinkRemoteDeviceType",), ("nvmlDeviceGetP2PStatus",)])
def test_older_drivers_still_see_the_switches(fake_driver, build_fake, omit):
    # Without the remote-type call a link whose far end is not one of the cards is a switch link;
    # without P2P status, cards on switches are taken to share the fabric.
    hgx(fake_driver.machine)
    fake_driver.lib = build_fake(omit=omit)
    fake_driver.write()
    doc = json.loads(fake_driver.run("topo", "--json").stdout)
    assert doc["gpus"][3]["links"]["6"] == "NV18"


def test_select_places_by_the_fabric_not_by_pcie(fake_driver):
    # Every pair is NV18, so the least loaded pair wins, even across sockets (PCIe would say SYS).
    hgx(fake_driver.machine)
    for i, card in enumerate(fake_driver.machine.cards):
        card.extra.update(util=0, mem_used=GIB // 2 if i in (0, 4) else 3 * GIB // 2)
    fake_driver.write()
    snap = json.loads(fake_driver.run("snapshot", "--json").stdout)
    uuid = {g["index"]: g["uuid"] for g in snap["gpus"]}
    out = fake_driver.run("select", "--count", "2", "--verbose")
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.strip().split(",")) == {uuid[0], uuid[4]}
    assert "18 NVLinks" in out.stderr


def fabric_machine(machine) -> None:
    machine.cards = [
        Card("NVIDIA H100 80GB HBM3", extra=dict(switch_links=18, fabric="completed")),
        Card("NVIDIA H100 80GB HBM3", extra=dict(switch_links=18, fabric="not_started")),
        Card("NVIDIA H100 80GB HBM3", extra=dict(switch_links=18, fabric="in_progress")),
        Card("NVIDIA H100 80GB HBM3", extra=dict(switch_links=18, fabric="completed", fabric_status=999)),
        Card("NVIDIA H100 80GB HBM3", extra=dict(switch_links=18, fabric="completed", fabric_health=2)),
        Card("NVIDIA L4"),  # a PCIe card: no fabric at all
    ]


def test_fabric_state_in_json_and_text(fake_driver):
    fabric_machine(fake_driver.machine)
    fake_driver.write()
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    assert [g["fabric"] for g in doc["gpus"]] == ["ready", "not_started", "in_progress", "failed", "degraded", None]
    text = fake_driver.run("snapshot").stdout
    assert "GPU 1: NVSwitch fabric not started" in text and "nvidia-fabricmanager" in text
    assert "GPU 0: NVSwitch fabric" not in text and "GPU 5: NVSwitch" not in text


@pytest.mark.parametrize(("omit", "max_version", "expected"), [
    ((), 2, "not_started"),  # a driver that knows the v2 struct only
    (("nvmlDeviceGetGpuFabricInfoV",), 3, "not_started"),  # before the versioned call: the original one
    (("nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"), 3, None),  # before fabrics: null
])
def test_fabric_on_older_drivers(fake_driver, build_fake, omit, max_version, expected):
    fake_driver.machine.cards = [Card(extra=dict(switch_links=18, fabric="not_started"))]
    fake_driver.machine.fabric_info_max = max_version
    fake_driver.lib = build_fake(omit=omit)
    fake_driver.write()
    out = fake_driver.run("snapshot", "--json")
    assert out.returncode == 0, out.stderr
    gpu = json.loads(out.stdout)["gpus"][0]
    assert gpu["fabric"] == expected and gpu["state"] == "ok"


def test_fabric_rule_fires_for_cards_not_registered(fake_driver):
    fabric_machine(fake_driver.machine)
    fake_driver.write()
    out = fake_driver.run("watch", "--alert", "fabric", "--interval", "0.2", "--count", "2")
    assert out.returncode == 0, out.stderr
    firing = sorted(e["gpu"] for e in map(json.loads, out.stdout.splitlines()) if e["event"] == "firing")
    assert firing == [1, 2, 3]  # not started, in progress, failed; a degraded fabric is still up


def test_fabric_is_exported_like_dcgm_exporter(fake_driver):
    from promlab import exposition

    from gpumon.alerting.prometheus_rules import rule_expr
    from gpumon.alerting.rules import parse_rule
    from gpumon.cards.sampler import sample_once
    from gpumon.exporter.collector import GpumonCollector

    fabric_machine(fake_driver.machine)
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        snap = sample_once(backend)
    finally:
        backend.close()
    text = exposition(GpumonCollector(lambda: snap)).decode()
    values = {line.split('gpu="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
              for line in text.splitlines() if line.startswith("DCGM_FI_DEV_FABRIC_MANAGER_STATUS{")}
    assert values == {"0": "3.0", "1": "1.0", "2": "2.0", "3": "4.0", "4": "3.0"}  # none for the PCIe card
    assert rule_expr(parse_rule("fabric on 1")) == \
        'max without (hpc_job, pod, namespace, container) (DCGM_FI_DEV_FABRIC_MANAGER_STATUS{gpu=~"1"} != 3)'


def test_exported_fabric_rule_is_valid_promql(fake_driver, tmp_path):
    promtool = require_tool("promtool")
    out = fake_driver.run("alerts", "export", "--prometheus-rules", "--alert", "fabric for 5m")
    assert out.returncode == 0, out.stderr
    rules = tmp_path / "rules.yml"
    rules.write_text(out.stdout)
    import subprocess

    check = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_tui_shows_a_fabric_that_is_not_ready(fake_driver):
    fabric_machine(fake_driver.machine)
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))

    async def go():
        app = create_app(backend, interval=0.2)
        async with app.run_test(size=(160, 60)) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.pause(0.3)
            panels = app.main_screen.query_one(CardList).panels
            text = ["\n".join(line.plain for line in p.lines(150)) for p in panels]
            assert "fabric not started" in text[1].lower()
            assert "fabric" not in text[0].lower() and "fabric" not in text[5].lower()

    try:
        asyncio.run(go())
    finally:
        backend.close()
