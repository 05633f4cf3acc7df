"""/etc/gpumon/config.toml ($GPUMON_SYSTEM_CONFIG in tests): read before the user's, the user's wins per
key, and `gpumon config --show` says where each setting came from."""

from __future__ import annotations

import os
import subprocess
import sys


def _gpumon(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumon", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def _settings(stdout: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in stdout.splitlines()[1:]:
        setting, _, source = line.partition("# ")
        name, _, value = setting.partition(" = ")
        rows[name] = (value.strip(), source.strip())
    return rows


def test_the_system_file_is_read_first_and_the_user_wins_per_key(tmp_path):
    system = tmp_path / "etc-gpumon.toml"
    system.write_text('interval = 2.5\ntheme = "gpumon-light"\n[watch]\nhook_timeout = 3\n')
    user = tmp_path / "user" / "gpumon" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('# my own\ntheme = "gpumon-dark"\n')
    env = dict(os.environ, GPUMON_SYSTEM_CONFIG=str(system), XDG_CONFIG_HOME=str(tmp_path / "user"))
    done = _gpumon(env, "config", "--show")
    assert done.returncode == 0 and done.stderr == ""
    rows = _settings(done.stdout)
    assert rows["interval"] == ("2.5", f"{system}:1")
    assert rows["theme"] == ('"gpumon-dark"', f"{user}:2")
    assert rows["watch.hook_timeout"] == ("3", f"{system}:4")
    assert rows["readonly"] == ("false", "default")
    assert str(system) in done.stdout.splitlines()[0] and str(user) in done.stdout.splitlines()[0]


def test_a_service_user_without_a_home_gets_the_admins_settings(fake_driver, tmp_path):
    fake_driver.write()
    system = tmp_path / "etc-gpumon.toml"
    system.write_text("interval = 0.5\n")
    env = dict(fake_driver.env, GPUMON_SYSTEM_CONFIG=str(system), HOME="/nonexistent",
               XDG_CONFIG_HOME="/nonexistent/.config")
    rows = _settings(_gpumon(env, "config", "--show").stdout)
    assert rows["interval"] == ("0.5", f"{system}:1")
    assert _gpumon(env, "snapshot", "--json").returncode == 0


def test_a_broken_system_file_is_one_line_naming_it(fake_driver, tmp_path):
    fake_driver.write()
    system = tmp_path / "etc-gpumon.toml"
    system.write_text('interval = 1\nrules = ["temp >> 85"]\n')
    env = dict(fake_driver.env, GPUMON_SYSTEM_CONFIG=str(system))
    for command in (["snapshot"], ["health"], ["config", "--show"]):
        done = _gpumon(env, *command)
        assert done.returncode == 2 and done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert str(system) in line and "line 2" in line


def test_no_files_at_all_shows_the_defaults(tmp_path):
    done = _gpumon(dict(os.environ), "config", "--show")
    assert done.returncode == 0
    assert "none" in done.stdout.splitlines()[0]
    assert all(source == "default" for _, source in _settings(done.stdout).values())
