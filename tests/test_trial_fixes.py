"""What a newcomer's trial hit, each against the real program."""

from __future__ import annotations

from conftest import Card

A100 = "NVIDIA A100-SXM4-80GB"


def test_replaying_a_file_that_is_no_recording_is_one_line(fake_driver, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("".join(f"line {n} of some notes\n" for n in range(50)))
    done = fake_driver.run("snapshot", "--replay", str(text))
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert str(text) in line and "not a gpumon recording" in line


def test_a_memory_temperature_over_its_maximum_says_over(fake_driver):
    fake_driver.machine.cards = [Card(A100, extra=dict(mem_temp=97, mem_temp_max=95))]
    fake_driver.write()
    done = fake_driver.run("health")
    assert "memory at 97 °C, 2 °C over its maximum of 95 °C" in done.stdout, done.stdout
    assert "−2" not in done.stdout and "-2" not in done.stdout
    fake_driver.machine.cards = [Card(A100, extra=dict(mem_temp=92, mem_temp_max=95))]
    fake_driver.write()
    assert "memory at 92 °C, 3 °C from its maximum of 95 °C" in fake_driver.run("health").stdout
