"""AMD and Intel cards everywhere else: `watch` (alert events, the Prometheus exporter), recording
and replay, and the fleet (another host's stream, over the real sshd)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import Card
from promlab import serve_and_scrape
from test_prometheus import free_port


def test_watch_alerts_and_records_amd_cards_and_a_replay_shows_them(fake_kernel, tmp_path):
    fake_kernel.sys.amd()
    recording = tmp_path / "amd.jsonl"
    out = fake_kernel.run("watch", "--interval", "0.2", "--count", "3", "--alert", "temp > 40",
                          "--alert", "mem_used > 2G on 0", "--format", "jsonl", "--record", str(recording))
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    firing = {(e["metric"], e["gpu"], e["uuid"], e["value"]) for e in events if e["event"] == "firing"}
    assert ("temp", 0, "GPU-5a2c1e8172f8a8b6", 45) in firing and ("mem_used", 0, "GPU-5a2c1e8172f8a8b6",
                                                                   3 << 30) in firing
    replay = subprocess.run([sys.executable, "-m", "gpumon", "snapshot", "--json", "--replay", str(recording)],
                            capture_output=True, text=True, timeout=60)
    assert replay.returncode == 0, replay.stderr
    (gpu,) = json.loads(replay.stdout)["gpus"]
    assert (gpu["vendor"], gpu["temperature_junction"], gpu["gtt_total"], gpu["asleep"]) == ("amd", 52, 128 << 30,
                                                                                            False)


def test_the_exporter_serves_amd_cards_under_dcgms_names_with_a_vendor(fake_driver, fake_kernel):
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", extra=dict(temp=61))]
    fake_driver.write()
    fake_kernel.sys.amd()
    port = free_port()
    body = serve_and_scrape(fake_kernel.argv("watch", "--interval", "0.3", "--prometheus", str(port)),
                            fake_driver.env, port, lambda body: "DCGM_FI_DEV_GPU_TEMP{" in body)
    temps = [line for line in body.splitlines() if line.startswith("DCGM_FI_DEV_GPU_TEMP{")]
    amd = next(line for line in temps if 'vendor="amd"' in line)
    assert 'device="amd1"' in amd and 'gpu="1"' in amd and 'UUID="GPU-5a2c1e8172f8a8b6"' in amd
    assert amd.endswith(" 45.0") and any('vendor="nvidia"' in line and line.endswith(" 61.0") for line in temps)


def test_a_fleet_host_with_amd_cards(ssh_lab, fake_kernel):
    """Over the real sshd: one host reads NVIDIA's driver, the other only AMD cards (its config's
    [paths] points at the fake tree); both in one document."""
    ssh_lab.host("nv").machine.cards = [Card("NVIDIA A100-SXM4-80GB")]
    ssh_lab.hosts["nv"].write()
    amd = ssh_lab.host("amd", env={"GPUMON_NVML_LIB": fake_kernel.no_nvidia})
    (amd.root / "config" / "gpumon").mkdir(parents=True)
    (amd.root / "config" / "gpumon" / "config.toml").write_text(
        f'[paths]\nsysfs = "{fake_kernel.sys.root}"\nprocfs = "{fake_kernel.proc.root}"\n')
    fake_kernel.sys.amd()
    out = ssh_lab.gpumon("snapshot", "--json", "--hosts", "nv,amd")
    assert out.returncode == 0, out.stderr
    hosts = {h["host"]: h for h in json.loads(out.stdout)["hosts"]}
    assert hosts["amd"]["state"] == "ok", hosts["amd"]
    (card,) = hosts["amd"]["snapshot"]["gpus"]
    assert (card["vendor"], card["uuid"], card["temperature_junction"]) == ("amd", "GPU-5a2c1e8172f8a8b6", 52)
    assert hosts["amd"]["snapshot"]["backend"] == "drm"
    assert [g["vendor"] for g in hosts["nv"]["snapshot"]["gpus"]] == ["nvidia"]


def test_a_cluster_read_through_prometheus_keeps_gpumons_vendor_label():
    """gpumon's exporter labels AMD cards vendor="amd"; dcgm-exporter's series have no vendor."""
    from gpumon.fleet.prometheus.dcgm import read_cluster

    def labels(gpu: int, **more: str) -> dict[str, str]:
        return {"gpu": str(gpu), "UUID": f"GPU-{gpu}", "modelName": "a card", "Hostname": "node1",
                "pci_bus_id": f"00000000:{gpu + 17:02X}:00.0", **more}

    cards = [labels(0), labels(1, vendor="amd"), labels(2, vendor="intel"), labels(3, vendor="\x1b[2J")]
    readings = [({**lab, "__name__": "DCGM_FI_DEV_GPU_TEMP"}, 50.0) for lab in cards]
    cluster = read_cluster(1.0, [(lab, 1.0) for lab in cards], readings, [], [])
    gpus = cluster.hosts["node1"].snapshot().gpus
    assert [g.vendor for g in gpus] == ["nvidia", "amd", "intel", "nvidia"]
