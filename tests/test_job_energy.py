"""Energy per job: the supervisor reads the job's cards' energy counters from its start to its end
(the fake driver's counter counts up with the card's power), through a real `gpumon run`."""

from __future__ import annotations

import sys
import time

from conftest import GIB, Card
from test_job_lifecycle import pid_script, state_of
from test_jobs import run_job, wait_for


def two_cards(fake_driver, watts: int = 300) -> None:
    fake_driver.machine.cards = [Card("NVIDIA A40", uuid=f"GPU-{i}{i}{i}{i}eeee-1111-2222-3333-44445555666{i}",
                                      bus=f"00000000:{0x21 + i:02X}:00.0", mem_total=48 * GIB,
                                      extra=dict(power_mw=watts * 1000, energy_mj=5_000_000_000))
                                 for i in range(2)]
    fake_driver.write()


def test_a_job_records_the_energy_its_cards_used_while_it_ran(fake_driver):
    two_cards(fake_driver)
    started = time.monotonic()
    result = run_job(fake_driver, "--gpu", "0,1", "--", sys.executable, "-c", "import time; time.sleep(2)")
    assert result.returncode == 0, result.stderr
    job = state_of(fake_driver, "exited")
    took = time.monotonic() - started
    # Two cards at 300 W for about the 2 s it ran: about 1200 J, never the counter's 5 MJ since load.
    assert 2 * 300 * 1.5 <= job["energy_j"] <= 2 * 300 * took + 300, job
    assert job["energy_shared"] is False
    table = fake_driver.run("jobs").stdout
    assert "ENERGY" in table.splitlines()[0] and " Wh" in table and "~" not in table


def test_energy_is_marked_shared_when_another_process_used_the_card(fake_driver, tmp_path):
    two_cards(fake_driver)
    pid_file = tmp_path / "pid"
    run_job(fake_driver, "--gpu", "0", "--", *pid_script(pid_file, seconds=3))
    wait_for(lambda: pid_file.exists() and pid_file.read_text(), what="job pid")
    fake_driver.machine.procs = [dict(gpu=0, pid=1, mem=GIB)]  # someone else's process on the job's card
    fake_driver.write()
    job = state_of(fake_driver, "exited")
    assert job["energy_j"] > 0 and job["energy_shared"] is True
