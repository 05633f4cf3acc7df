"""One duration grammar for every option, config key and rule (`500ms 30s 10m 2h 2d 1w`): what
one command accepts, every other does too."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpumon.errors import UsageError
from gpumon.units import format_duration, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("500ms", 0.5), ("30s", 30), ("10m", 600), ("10min", 600), ("2h", 7200), ("2d", 2 * 86400),
    ("1w", 7 * 86400), ("1.5h", 5400), (" 7D ", 7 * 86400), ("0s", 0)])
def test_one_parser_reads_every_unit(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "10", "5x", "s", "-1s", "1y", "2 weeks", "1e3s"])
def test_one_parser_refuses_the_rest_naming_what_it_reads(text):
    with pytest.raises(UsageError, match=r"bad --for .*expected e\.g\. 500ms, 30s, 10m, 2h, 2d or 1w"):
        parse_duration(text, "--for")


def test_above_zero_refuses_zero():
    with pytest.raises(UsageError, match="bad --since '0d'"):
        parse_duration("0d", "--since", above_zero=True)


def test_days_are_said_in_days():
    assert [format_duration(s) for s in (45, 720, 7920, 2 * 86400, 3 * 86400 + 4 * 3600)] == [
        "45s", "12m", "2h12m", "2d0h", "3d4h"]


def test_an_idle_rule_of_a_day_is_accepted(fake_driver):
    ok = fake_driver.run("watch", "--alert", "idle > 1d", "--alert", "temp > 80 for 1d", "--count", "1")
    assert ok.returncode == 0, ok.stderr
    bad = fake_driver.run("watch", "--alert", "idle > 1y", "--count", "1")
    assert bad.returncode == 2 and "expected e.g. 500ms, 30s, 10m, 2h, 2d or 1w" in bad.stderr, bad.stderr


def _gpumon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumon", *args], capture_output=True, text=True, timeout=60)


def test_report_since_and_history_keep_read_days_and_weeks(tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[history]\nkeep = "90d"\n[jobs]\nkeep_for = "1w"\n')
    for since in ("2d", "1w", "36h"):
        out = _gpumon("--config", str(config), "report", "--since", since)
        assert out.returncode == 1 and "no usage history" in out.stderr, (since, out.stderr)
    for since in ("0d", "2x", "7"):
        out = _gpumon("report", "--since", since)
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, (since, out.stderr)
    config.write_text('[history]\nkeep = "0d"\n')
    out = _gpumon("--config", str(config), "report", "--since", "2d")
    assert out.returncode == 2 and "[history] keep" in out.stderr, out.stderr
