"""Every command checks the config, its alert rules included: a broken rule is one line naming the file."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("command", [("snapshot",), ("health",), ("topo",), ("doctor",)])
def test_a_broken_rule_in_the_config_stops_every_command(fake_driver, tmp_path, command):
    fake_driver.write()
    config = tmp_path / "config.toml"
    config.write_text('theme = "gpumon-dark"\nrules = ["temp >> 85"]\n')
    done = fake_driver.run(*command, "--config", str(config))
    assert done.returncode == 2
    if command == ("doctor",):
        assert str(config) in done.stdout and "fail" in done.stdout
        return
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and str(config) in lines[0] and "line 2" in lines[0] and "temp >> 85" in lines[0]
