"""AMD cards' health from amdgpu's RAS files (fake trees written from amdgpu_ras.c and ras.rst), and
cards with no counters at all saying so rather than passing for checked: `gpumon health`,
`snapshot --json`, the exporter and the TUI's `h`."""

from __future__ import annotations

import asyncio
import json
import time

from fakedrm import RX7900, RX7900_HWMON, bad_page
from promlab import serve_and_scrape
from test_prometheus import free_port
from test_tui import started
from test_vendor_cards import Clock, backend
from textual.geometry import Region

from gpumon.health import rules as health
from gpumon.tui.app import create_app
from gpumon.tui.screens.health import HealthScreen

COUNTERS = ("ecc_errors_uncorrected", "ecc_errors_corrected", "retired_pages_pending", "retired_pages_reserved",
            "retired_pages_failed")


def health_json(kernel) -> tuple[int, list[dict]]:
    out = kernel.run("health", "--json")
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout)["gpus"]


def test_an_instinct_card_reports_its_ras_counters_and_fails_on_errors_and_pending_pages(fake_kernel):
    card = fake_kernel.sys.amd()
    status, (gpu,) = health_json(fake_kernel)
    assert status == 0 and gpu["health"] == {"verdict": "ok", "reasons": []}  # judged from its counters
    assert [gpu[k] for k in COUNTERS] == [0, 0, False, 0, 0]

    # Errors in two blocks (a newer kernel's "de:" line, deferred errors, is not a count of either),
    # a block the driver cannot ask now, and bad pages: one retired, two pending.
    fake_kernel.sys.set(card, "ras/umc_err_count", "ue: 0\nce: 3\nde: 1")
    fake_kernel.sys.set(card, "ras/gfx_err_count", "ue: 1\nce: 2")
    fake_kernel.sys.set(card, "ras/sdma_err_count", "Query currently inaccessible")
    fake_kernel.sys.set(card, "ras/gpu_vram_bad_pages", bad_page(0x1a, "R") + bad_page(0x2b, "P") + bad_page(7, "P"))
    doc = fake_kernel.snapshot()
    assert [doc["gpus"][0][k] for k in COUNTERS] == [1, 5, True, 1, 0]
    assert doc["gpus"][0]["health"]["verdict"] == "fail"

    status, (gpu,) = health_json(fake_kernel)
    assert status == 2 and gpu["health"]["verdict"] == "fail"
    reasons = {r["code"]: r for r in gpu["health"]["reasons"]}
    assert set(reasons) == {"ecc_uncorrected", "retired_pending"}
    assert reasons["ecc_uncorrected"]["text"].startswith("1 uncorrectable errors since the driver loaded (amdgpu")
    assert reasons["retired_pending"]["action"].startswith("reset the card or reboot to retire the pending pages")
    assert "nvidia-smi" not in json.dumps(gpu["health"])

    lines = fake_kernel.run("health")
    assert lines.returncode == 2 and lines.stdout.startswith("GPU 0  FAIL  AMD Instinct MI210  GPU-5a2c1e8172f8a8b6")
    assert "retired_pending: bad memory pages are waiting to be retired" in lines.stdout

    # A page the driver could not retire: the card needs service.
    fake_kernel.sys.set(card, "ras/gfx_err_count", "ue: 0\nce: 0")
    fake_kernel.sys.set(card, "ras/gpu_vram_bad_pages", bad_page(0x1a, "R") + bad_page(0x2c, "F"))
    status, (gpu,) = health_json(fake_kernel)
    assert status == 2 and [r["code"] for r in gpu["health"]["reasons"]] == ["retire_failed"]
    assert (gpu["retired_pages_failed"], gpu["retired_pages_pending"]) == (1, False)
    assert "1 bad memory pages could not be retired" in gpu["health"]["reasons"][0]["text"]


def test_cards_without_counters_are_ok_from_their_state_only_and_say_so(fake_kernel, tmp_path):
    fake_kernel.sys.amd(files=RX7900, hwmon=RX7900_HWMON)  # a Radeon: no ras/ at all
    fake_kernel.sys.intel("0000:83:00.0", driver="xe", parents=("pci0000:80",))
    # An Instinct card on a kernel (or with bad_page_threshold=0) without the bad-pages file.
    fake_kernel.sys.amd("0000:43:00.0", parents=("pci0000:40",), drop=("ras/gpu_vram_bad_pages",))
    status, gpus = health_json(fake_kernel)
    assert status == 0, gpus
    radeon, instinct, xe = gpus
    for gpu, why in ((radeon, "amdgpu reports no RAS error counters"), (xe, "i915 and xe report no error counters")):
        assert gpu["health"]["verdict"] == "ok" and [r["code"] for r in gpu["health"]["reasons"]] == ["no_counters"]
        assert why in gpu["health"]["reasons"][0]["text"] and all(gpu[k] is None for k in COUNTERS)
    assert instinct["health"] == {"verdict": "ok", "reasons": []}
    assert [instinct[k] for k in COUNTERS] == [0, 0, None, None, None]

    # A site that wants to hear of unchecked cards makes the note a warning.
    config = tmp_path / "config.toml"
    config.write_text('[health.rules.no_counters]\nverdict = "warn"\n')
    out = fake_kernel.run("--config", str(config), "health")
    assert out.returncode == 1, out.stderr
    assert out.stdout.count("WARN") == 2 and "no_counters: no health counters" in out.stdout


def test_counters_are_read_every_interval_never_from_a_sleeping_card(fake_kernel):
    card = fake_kernel.sys.amd()
    clock = Clock()
    drm = backend(fake_kernel, clock)
    first = drm.sample().gpus[0]
    assert first.counters.ecc_errors_corrected == 0 and first.health.verdict == "ok"
    fake_kernel.sys.set(card, "ras/gpu_vram_bad_pages", bad_page(3, "P"))
    clock.now += health.HealthSettings().interval_s / 2
    between = drm.sample().gpus[0]
    assert between.counters is first.counters and between.health is first.health  # not read again yet
    clock.now += health.HealthSettings().interval_s
    fresh = drm.sample().gpus[0]
    assert fresh.counters.retired_pages_pending is True and fresh.health.verdict == "fail"

    # Asleep: its RAS files hang whoever opens them; it keeps what was last read (still pending).
    fifos = fake_kernel.sys.suspend(card)
    assert any(f.parent.name == "ras" for f in fifos)
    clock.now += 10 * health.HealthSettings().interval_s
    asleep = drm.sample().gpus[0]
    assert asleep.asleep is True and asleep.health.verdict == "fail"
    assert [r.code for r in asleep.health.reasons] == ["retired_pending"]

    # A card asleep from the start has nothing read: its ok says so.
    (never,) = backend(fake_kernel, Clock()).sample().gpus
    assert never.asleep is True and never.health.verdict == "ok"
    assert [r.code for r in never.health.reasons] == ["no_counters"] and "sleeps" in never.health.reasons[0].text


def test_an_unplugged_amd_card_fails_in_amd_words(fake_kernel):
    card = fake_kernel.sys.amd()
    drm = backend(fake_kernel)
    assert drm.sample().gpus[0].health.verdict == "ok"
    fake_kernel.sys.unplug(card)
    lost = drm.sample().gpus[0]
    assert lost.state == "lost" and lost.health.verdict == "fail"
    (reason,) = lost.health.reasons
    assert reason.code == "lost" and "gone from sysfs" in reason.text and "nvidia-smi" not in reason.action


def test_the_exporter_serves_amd_health_under_dcgms_names(fake_kernel):
    card = fake_kernel.sys.amd()
    fake_kernel.sys.set(card, "ras/umc_err_count", "ue: 2\nce: 7")
    fake_kernel.sys.set(card, "ras/gpu_vram_bad_pages", bad_page(1, "R") + bad_page(2, "P"))
    port = free_port()
    body = serve_and_scrape(fake_kernel.argv("watch", "--interval", "0.3", "--prometheus", str(port)),
                            fake_kernel.env, port, lambda body: "gpumon_gpu_health{" in body)
    series = {line.split("{")[0]: line for line in body.splitlines() if 'vendor="amd"' in line}
    assert series["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"].endswith(" 2.0")
    assert series["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"].endswith(" 7.0")
    assert series["DCGM_FI_DEV_RETIRED_PENDING"].endswith(" 1.0")
    assert series["gpumon_gpu_retired_pages_reserved"].endswith(" 1.0")
    verdict = series["gpumon_gpu_health"]
    assert 'reason="ecc_uncorrected,retired_pending"' in verdict and verdict.endswith(" 2.0")
    assert 'device="amd0"' in verdict and "DCGM_FI_DEV_RETIRED_DBE" not in series  # amdgpu does not say which


def test_h_shows_an_amd_cards_reasons_and_counters(fake_kernel):
    card = fake_kernel.sys.amd()
    fake_kernel.sys.set(card, "ras/gpu_vram_bad_pages", bad_page(1, "R") + bad_page(2, "P"))
    drm = backend(fake_kernel, clock=time.monotonic)
    app = create_app(drm, interval=0.2)

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("h")
            await pilot.pause(0.3)
            screen = app.screen
            assert isinstance(screen, HealthScreen)
            shown = " ".join(strip.text for static in screen.query("Static")
                             for strip in static.render_lines(Region(0, 0, *static.size)))
            assert "FAIL" in shown and "bad memory pages are waiting to be retired" in shown
            assert "reset the card or reboot to retire the pending pages" in shown
            assert "Retired pages" in shown and "Retirement pending" in shown

    try:
        asyncio.run(go())
    finally:
        drm.close()
