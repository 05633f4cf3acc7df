"""The TUI on a host with NVIDIA and AMD cards (and a sleeping one, and an Intel one): the real
gpumon in tmux, and `r` launching on the AMD card."""

from __future__ import annotations

import shlex
import sys

from conftest import Card
from fakedrm import MI210, RX7900, RX7900_HWMON, amdgpu_fdinfo
from test_tui import run, started
from test_tui_dialogs import wait_until

from gpumon.cards.backends import open_backend
from gpumon.tui.app import create_app
from gpumon.tui.screens.run_dialog import RunDialog
from gpumon.tui.screens.topology import TopologyScreen


def mixed_host(fake_driver, fake_kernel):
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", bus="00000000:07:00.0", extra=dict(util=11))]
    fake_driver.write()
    amd = fake_kernel.sys.amd(numa=0, cpus="0")
    sleeping = fake_kernel.sys.amd("0000:43:00.0", files=RX7900, hwmon=RX7900_HWMON, parents=("pci0000:40",))
    fake_kernel.sys.suspend(sleeping)
    fake_kernel.sys.intel("0000:83:00.0", driver="xe", parents=("pci0000:80",))
    return amd


def test_a_mixed_host_in_a_real_terminal(fake_driver, fake_kernel, idle_processes, tmux_session, tmp_path):
    amd = mixed_host(fake_driver, fake_kernel)
    trainer = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", "--rocm")
    fake_kernel.proc.client(trainer.pid, 5, amdgpu_fdinfo(amd.address, 3, vram_kib=5 << 20))
    status = tmp_path / "status"
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in fake_driver.env.items()
                   if k in ("GPUMON_NVML_LIB", "FAKE_NVML_CONFIG", "PATH", "HOME", "XDG_CONFIG_HOME", "TZ"))
    paths = " ".join(shlex.quote(a) for a in fake_kernel.paths)
    tmux = tmux_session(140, 45)
    tmux.start(f"env {env} TERM=xterm-256color {shlex.quote(sys.executable)} -m gpumon {paths} --interval 0.5; "
               f"echo $? > {status}")
    screen = tmux.wait_for(lambda s: "AMD Instinct MI210" in s and f" {trainer.pid} " in s,
                           what="the AMD card and its process")
    assert "A100-SXM4-80GB" in screen and "37%" in screen and "3.0G/64G" in screen
    assert "ROCm 0" in screen and "ROCm 1" in screen and "L0 0" in screen and "HOTSPOT 52°C" in screen
    assert "asleep" in screen and "so as not to wake it" in screen, screen
    assert str(trainer.pid) in screen and "5.0G" in screen
    fake_kernel.sys.set(amd, "gpu_busy_percent", "88")
    tmux.wait_for(lambda s: "88%" in s, what="the AMD card's new utilisation")
    tmux.keys("q")
    tmux.wait_for(lambda s: status.exists(), what="gpumon to quit")
    assert status.read_text().strip() == "0"


def test_r_launches_on_the_selected_amd_card(fake_driver, fake_kernel, tmp_path, monkeypatch):
    mixed_host(fake_driver, fake_kernel)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1")  # the user's shell had it: the job must not
    sysfs, procfs = str(fake_kernel.sys.root), str(fake_kernel.proc.root)
    backend = open_backend(nvml_lib=str(fake_driver.lib), sysfs=sysfs, procfs=procfs)
    out = tmp_path / "rocr"
    app = create_app(backend, interval=0.2,
                     backend_args={"nvml_lib": str(fake_driver.lib), "sysfs": sysfs, "procfs": procfs})

    async def go():
        async with app.run_test(size=(140, 45)) as pilot:
            await started(pilot)
            await pilot.press("j", "r")
            assert isinstance(app.screen, RunDialog)
            await pilot.press(*f'echo "$ROCR_VISIBLE_DEVICES|${{HIP_VISIBLE_DEVICES-unset}}" > {out}; sleep 30')
            await pilot.press("enter")
            await wait_until(pilot, lambda: out.exists() and out.read_text(), seconds=20, what="the job")
        assert out.read_text().strip() == "GPU-5a2c1e8172f8a8b6|unset"

    try:
        run(go())
    finally:
        backend.close()
        from gpumon.jobs import control, records

        for job in records.list_jobs():
            if job.state == "running":
                control.stop(job)


def test_t_says_which_sleeping_cards_xgmi_links_are_not_known(fake_kernel):
    hive = {"xgmi_hive_info/xgmi_hive_id": "1234567890abcdef"}
    fake_kernel.sys.amd("0000:03:00.0", files={**MI210, **hive})
    fake_kernel.sys.suspend(fake_kernel.sys.amd("0000:04:00.0", files={**MI210, **hive}))
    backend = open_backend(nvml_lib=fake_kernel.no_nvidia, sysfs=str(fake_kernel.sys.root),
                           procfs=str(fake_kernel.proc.root))
    app = create_app(backend, interval=0.2)

    async def go():
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("t")
            assert isinstance(app.screen, TopologyScreen)
            screen = app.screen
            await wait_until(pilot, lambda: not screen.reading, seconds=20, what="the links")
            partners = str(screen.query_one("#topo-partners").render())
            assert "GPU 1 asleep: its xGMI links are not known (reading them would wake it)" in partners

    try:
        run(go())
    finally:
        backend.close()
