"""The first frame names the cards before the first sample answers: the driver is opened while
Textual loads, and the names (read on each card's lane) are drawn before Textual starts."""

from __future__ import annotations

import os
import select
import time

from conftest import Card
from terminal import gpumon_on_pty

from gpumon.cards.backends.nvml import NvmlBackend

TEXTUAL_STARTED = b"\x1b[?1000h"  # Textual turns mouse reporting on as it starts; the splash never does


def test_identity_names_the_cards_at_once_and_leaves_a_hung_one_waiting(fake_driver):
    fake_driver.machine.cards = [Card("NVIDIA H100 80GB HBM3"), Card("NVIDIA H100 80GB HBM3", extra=dict(slow=3000)),
                                 Card("NVIDIA L4")]
    fake_driver.write()
    backend = NvmlBackend(lib_path=str(fake_driver.lib))
    try:
        started = time.monotonic()
        identity = backend.identity(0.3)
        assert time.monotonic() - started < 1.5
        assert [g.name for g in identity.gpus][::2] == ["NVIDIA H100 80GB HBM3", "NVIDIA L4"]
        assert [g.state for g in identity.gpus] == ["ok", "stale", "ok"]
        assert identity.gpus[0].uuid and identity.driver_version == "550.54.15"
        # The first sample finds the healthy cards open: their values come at once.
        sample = backend.sample(wait_s=0.5)
        assert sample.gpus[2].state == "ok" and sample.gpus[2].utilization_gpu is not None
    finally:
        backend.close()


def test_card_names_are_drawn_before_textual_starts_and_while_the_first_sample_hangs(fake_driver):
    # Every utilisation read takes 4 s: the names must not wait for that sample, nor for Textual.
    fake_driver.machine.cards = [Card("NVIDIA H100 80GB HBM3"), Card("NVIDIA H100 80GB HBM3")]
    fake_driver.machine.delays = {"nvmlDeviceGetUtilizationRates": 4000}
    fake_driver.write()
    started, out, named = time.monotonic(), b"", None
    with gpumon_on_pty(dict(fake_driver.env, TERM="xterm-256color"), (120, 30), "--interval", "1") as (_, master):
        while time.monotonic() - started < 15 and TEXTUAL_STARTED not in out:
            if select.select([master], [], [], 0.1)[0]:
                out += os.read(master, 65536)
                if named is None and b"H100 80GB" in out:
                    named = time.monotonic() - started
    assert TEXTUAL_STARTED in out, out[-500:]
    # Before Textual has even switched on the mouse, the first frame names the cards...
    assert 0 <= out.find(b"H100 80GB") < out.find(TEXTUAL_STARTED), out[:500]
    # ... long before the 4 s sample (typically 0.2 s; generous for a loaded machine).
    assert named is not None and named < 3.0
