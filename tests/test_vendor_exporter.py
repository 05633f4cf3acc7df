"""The exporter on a host with NVIDIA, AMD and Intel cards: AMD's cards under the names AMD's own
device-metrics-exporter gives them (and its labels), besides dcgm-exporter's; what AMD and Intel
cards tell that DCGM has no name for under gpumon's names. The real `gpumon watch --prometheus`,
scraped over HTTP, on the fake NVIDIA driver and a fake amdgpu/i915 tree, with a real process in a
real Slurm cgroup holding an AMD card."""

from __future__ import annotations

import getpass
import subprocess

from cgroup_lab import cgroup_lab  # noqa: F401 - the fixture
from conftest import Card
from fakedrm import RX7900, RX7900_HWMON, amdgpu_fdinfo
from prometheus_client.parser import text_string_to_metric_families
from promlab import serve_and_scrape
from test_prometheus import ALLOWED_LINT, free_port

from gpumon.exporter.amd import AMD_GAUGES, AMD_LABELS

MI210, RX, ARC = "AMD Instinct MI210", "AMD GPU 1002:744c", "Intel GPU 8086:56a0"  # the cards' names
# AMD's names keep AMD's spelling, whose lint findings (gauges named ..._total) promtool may report.
AMD_LINT = ('non-counter metrics should not have "_total" suffix',)


def scrape_when(fake_driver, fake_kernel, ready) -> str:
    port = free_port()
    return serve_and_scrape(fake_kernel.argv("watch", "--interval", "0.3", "--prometheus", str(port),
                                             "--prometheus-processes"), fake_driver.env, port, ready, 60)


def check_metrics(body: str) -> None:
    from conftest import require_tool
    promtool = require_tool("promtool")
    out = subprocess.run([promtool, "check", "metrics"], input=body.encode(), capture_output=True, timeout=30)
    problems = [line for line in out.stderr.decode().splitlines() + out.stdout.decode().splitlines() if line.strip()]
    assert out.returncode in (0, 3), problems
    assert all(any(allowed in p for allowed in ALLOWED_LINT + AMD_LINT) for p in problems), problems


def test_amd_cards_under_amds_own_names_nvidia_and_intel_never(fake_driver, fake_kernel, cgroup_lab,  # noqa: F811
                                                               idle_processes):
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", extra=dict(temp=61))]
    fake_driver.write()
    mi210 = fake_kernel.sys.amd()  # 0000:03:00.0, ROCm's first
    fake_kernel.sys.amd("0000:43:00.0", files=RX7900, hwmon=RX7900_HWMON, parents=("pci0000:40",))
    fake_kernel.sys.intel("0000:00:02.0")
    # A real process of Slurm job 77 (a real cgroup) holds the MI210 through its render node.
    trainer = idle_processes()
    cgroup_lab.place(cgroup_lab.v2 or cgroup_lab.v1, "system.slice/slurmstepd.scope/job_77/step_0/user/task_0",
                     trainer.pid)
    fake_kernel.proc.client(trainer.pid, 5, amdgpu_fdinfo(mi210.address, 3, vram_kib=1 << 20), node="renderD128")

    body = scrape_when(fake_driver, fake_kernel, lambda text: 'job_id="77"' in text and "DCGM_FI_DEV_GPU_TEMP{" in text)
    check_metrics(body)
    families = {f.name: f for f in text_string_to_metric_families(body)}

    def series(name: str) -> dict[str, tuple[dict[str, str], float]]:
        """The family's samples by the card's name (card_model, or dcgm's modelName)."""
        return {s.labels.get("card_model", s.labels.get("modelName")): (s.labels, s.value)
                for s in families[name].samples}

    gfx = series("gpu_gfx_activity")
    assert sorted(gfx) == [RX, MI210]  # the two AMD cards: not the NVIDIA card, not the Intel one
    labels, value = gfx[MI210]
    assert value == 37
    assert {k: labels[k] for k in AMD_LABELS if k != "hostname"} == {
        "gpu_id": "0", "gpu_uuid": "GPU-5a2c1e8172f8a8b6", "serial_number": "692231000131", "card_model": MI210,
        "vbios_version": "113-D67301-063", "job_id": "77", "job_user": getpass.getuser(), "pod": "",
        "namespace": "", "container": "", "job_partition": ""}
    # The Radeon: ROCm's second card; no unique id, no serial number, nobody holds it.
    assert {k: gfx[RX][0][k] for k in ("gpu_id", "gpu_uuid", "serial_number", "job_id")} == {
        "gpu_id": "1", "gpu_uuid": "", "serial_number": "", "job_id": ""}
    assert gfx[RX][1] == 3
    # Every AMD family has one set of label names (Prometheus requires it), whatever the card lacks.
    for name, _, _ in AMD_GAUGES:
        for sample in families[name].samples:
            assert sorted(sample.labels) == sorted(AMD_LABELS), (name, sample.labels)
    # Values in AMD's units: MB (MiB) for VRAM and GTT, GT/s for the link, °C, W.
    expected = {"gpu_umc_activity": 12, "gpu_edge_temperature": 45, "gpu_junction_temperature": 52,
                "gpu_memory_temperature": 48, "gpu_power_usage": 123, "gpu_total_vram": 65536, "gpu_used_vram": 3072,
                "gpu_free_vram": 65536 - 3072, "gpu_total_gtt": 131072, "gpu_used_gtt": 20,
                "gpu_free_gtt": 131072 - 20, "pcie_speed": 16, "pcie_max_speed": 32, "gpu_ecc_uncorrect_total": 0,
                "gpu_ecc_correct_total": 0}
    assert {name: series(name)[MI210][1] for name in expected} == expected
    # The Radeon has no RAS counters: its ECC series are left out, not 0.
    assert RX not in series("gpu_ecc_uncorrect_total") and series("pcie_speed")[RX][1] == 2.5
    clocks = {(s.labels["card_model"], s.labels["clock_index"], s.labels["clock_type"]): s.value
              for s in families["gpu_clock"].samples}
    assert clocks[MI210, "0", "SYSTEM"] == 1700 and clocks[MI210, "1", "MEMORY"] == 1600
    assert {s.value for s in families["gpu_health"].samples} == {1.0}
    assert [(s.labels, s.value) for s in families["gpu_nodes_total"].samples] == [
        ({"hostname": labels["hostname"]}, 2.0)]

    # No AMD name for the NVIDIA or the Intel card, anywhere.
    assert series("DCGM_FI_DEV_GPU_TEMP")["NVIDIA A100-SXM4-80GB"][1] == 61
    amd_names = [name for name, _, _ in AMD_GAUGES] + ["gpu_clock", "gpu_health"]
    assert {s.labels["card_model"] for name in amd_names for s in families[name].samples} == {MI210, RX}
    amd_part = body.split("# HELP gpu_nodes_total")[1].split("# HELP gpumon_sample_age_seconds")[0]
    assert "NVIDIA" not in amd_part and ARC not in amd_part and MI210 in amd_part
    # AMD cards keep dcgm-exporter's names; what DCGM has no name for is gpumon's, for every vendor.
    assert {card: value for card, (_, value) in series("DCGM_FI_DEV_MEMORY_TEMP").items()} == {MI210: 48, RX: 50}
    link = {(s.labels["vendor"], s.labels["modelName"]): s.value
            for s in families["gpumon_gpu_pcie_link_speed_gts"].samples}
    assert link == {("amd", MI210): 16, ("amd", RX): 2.5, ("intel", ARC): 2.5}
    assert series("gpumon_gpu_junction_temperature_celsius")[MI210][1] == 52
    assert series("gpumon_gpu_gtt_total_bytes")[MI210][1] == 128 << 30
    assert series("gpumon_gpu_pcie_link_width_max")[MI210][1] == 16
