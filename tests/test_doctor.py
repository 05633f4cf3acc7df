"""`gpumon doctor`: each check against the real thing it checks (the fake driver, a config file, a real
sshd and a dead one, a port someone holds)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from sshd import free_port
from test_claims import free_cards


def _doctor(env: dict[str, str], *args: str) -> tuple[int, dict[str, dict]]:
    done = subprocess.run([sys.executable, "-m", "gpumon", "doctor", "--json", *args], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.stderr == ""
    doc = json.loads(done.stdout)
    assert doc["status"] == done.returncode
    return done.returncode, {c["id"]: c for c in doc["checks"]}


def test_the_fake_driver_is_found_with_its_version_and_nvml_answers(fake_driver):
    fake_driver.write()
    status, checks = _doctor(fake_driver.env)
    assert checks["driver.library"]["status"] == "ok"
    assert str(fake_driver.lib) in checks["driver.library"]["summary"]
    assert ", driver " in checks["driver.library"]["summary"]
    assert checks["nvml.answers"]["status"] == "ok" and "card" in checks["nvml.answers"]["summary"]
    assert checks["nvml.functions"]["status"] == "ok"
    assert checks["textual.version"]["status"] == "ok"
    assert checks["config.valid"]["status"] == "ok"
    assert status == max({"ok": 0, "warn": 1, "fail": 2}[c["status"]] for c in checks.values())


def test_a_library_that_is_not_there_is_a_failure_with_the_fix(fake_driver):
    status, checks = _doctor(fake_driver.env, "--nvml-lib", "/nonexistent/libnvidia-ml.so.1")
    assert status == 2
    assert checks["driver.library"]["status"] == "fail"
    assert "/nonexistent/libnvidia-ml.so.1" in checks["driver.library"]["summary"]
    assert "--nvml-lib" in checks["driver.library"]["fix"]


def test_a_driver_lacking_a_function_warns_and_says_what_is_lost(build_fake, fake_driver):
    fake_driver.write()
    env = dict(fake_driver.env, GPUMON_NVML_LIB=str(build_fake(omit=("nvmlDeviceGetPowerUsage",))))
    status, checks = _doctor(env)
    assert checks["nvml.answers"]["status"] == "ok"
    lacking = checks["nvml.functions"]
    assert lacking["status"] == "warn" and "nvmlDeviceGetPowerUsage" in lacking["summary"]
    assert "power" in lacking["summary"]
    assert status >= 1


def test_a_broken_config_fails_naming_the_file_and_line(fake_driver, tmp_path):
    fake_driver.write()
    config = tmp_path / "config.toml"
    config.write_text('interval = 1.0\n[watch]\nrules = ["temp >> 85"]\n')
    status, checks = _doctor(fake_driver.env, "--config", str(config))
    assert status == 2
    bad = checks["config.valid"]
    assert bad["status"] == "fail" and str(config) in bad["summary"] and "line 3" in bad["summary"]


def test_ssh_to_each_configured_host_a_live_one_and_a_dead_one(ssh_lab, tmp_path):
    ssh_lab.host("alive")
    dead_server = ssh_lab.server()
    ssh_lab.host("dead", server=dead_server)
    dead_server.kill()
    config = tmp_path / "config.toml"
    config.write_text(f'[fleet]\nhosts = ["alive"]\nssh = "{ssh_lab.ssh}"\nremote = "{ssh_lab.remote_gpumon}"\n'
                      '[fleet.groups]\nlab = ["dead", "alive"]\n')
    status, checks = _doctor(ssh_lab.env(), "--config", str(config))
    from gpumon import __version__

    assert checks["ssh.alive"]["status"] == "ok" and __version__ in checks["ssh.alive"]["summary"]
    assert checks["ssh.dead"]["status"] == "fail" and "connection refused" in checks["ssh.dead"]["summary"]
    assert status == 2


def test_a_busy_exporter_port_is_named(fake_driver, tmp_path):
    fake_driver.write()
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f'[watch]\nprometheus = "127.0.0.1:{port}"\n')
    _, checks = _doctor(fake_driver.env, "--config", str(config))
    assert checks["exporter.port"]["status"] == "ok"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        status, checks = _doctor(fake_driver.env, "--config", str(config))
    assert checks["exporter.port"]["status"] == "warn" and f"127.0.0.1:{port}" in checks["exporter.port"]["summary"]
    assert status >= 1


def test_the_text_form_is_one_line_per_check(fake_driver):
    fake_driver.write()
    done = fake_driver.run("doctor")
    lines = done.stdout.splitlines()
    assert lines and all(line.split()[0] in ("ok", "warn", "fail") for line in lines)
    assert any(line.split()[1] == "driver.library" for line in lines)


def test_the_claims_folder_checked_is_the_one_the_config_names(fake_driver, tmp_path):
    fake_driver.write()
    env = {k: v for k, v in fake_driver.env.items() if k != "GPUMON_CLAIMS_DIR"}
    team = tmp_path / "team-claims"
    team.mkdir(mode=0o755)  # not sticky: anyone who may write there could remove another's claim
    config = tmp_path / "config.toml"
    config.write_text(f'[claims]\ndir = "{team}"\n')
    _, checks = _doctor(env, "--config", str(config))
    claims = checks["claims.dir"]
    assert claims["status"] == "warn" and f"{team} is not sticky" in claims["summary"], claims
    assert "[claims] dir" in claims["summary"] and claims["fix"] == f"chmod 1777 {team}"

    team.chmod(0o1777)
    _, checks = _doctor(env, "--config", str(config))
    assert checks["claims.dir"]["status"] == "ok" and str(team) in checks["claims.dir"]["summary"]

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    config.write_text(f'[claims]\ndir = "{blocked}/claims"\n')  # a folder that cannot be made there
    _, checks = _doctor(env, "--config", str(config))
    assert checks["claims.dir"]["status"] == "fail" and f"{blocked}/claims" in checks["claims.dir"]["summary"]

    # $GPUMON_CLAIMS_DIR (as everything that uses the folder reads it) wins over the config.
    _, checks = _doctor(dict(env, GPUMON_CLAIMS_DIR=str(team)), "--config", str(config))
    assert str(team) in checks["claims.dir"]["summary"] and "$GPUMON_CLAIMS_DIR" in checks["claims.dir"]["summary"]


def test_without_a_claims_setting_the_default_folder_is_checked(fake_driver, tmp_path):
    fake_driver.write()
    env = {k: v for k, v in fake_driver.env.items() if k != "GPUMON_CLAIMS_DIR"}
    config = tmp_path / "config.toml"
    config.write_text("interval = 1.0\n")
    _, checks = _doctor(env, "--config", str(config))
    assert "/tmp/gpumon-claims" in checks["claims.dir"]["summary"]


@pytest.mark.parametrize("trap", ["link", "group-writable"])
def test_doctor_says_of_the_claims_folder_what_a_launch_finds(fake_driver, tmp_path, trap):
    """One check for both: a link to another user's sticky folder, or a folder its group may write
    but not sticky, is refused by a launch, and doctor fails it in the same words."""
    free_cards(fake_driver.machine, 1)
    fake_driver.write()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    if trap == "link":
        theirs.chmod(0o1777)
        os.chown(theirs, 65534, 65534)  # nobody's: the link could point anywhere its maker likes
        place = tmp_path / "claims"
        place.symlink_to(theirs)
    else:
        theirs.chmod(0o775)
        place = theirs
    env = dict(fake_driver.env, GPUMON_CLAIMS_DIR=str(place))
    _, checks = _doctor(env)
    claims = checks["claims.dir"]
    assert claims["status"] == "fail", claims
    why = claims["summary"].removesuffix(" ($GPUMON_CLAIMS_DIR)")
    launched = subprocess.run([sys.executable, "-m", "gpumon", "run", "--foreground", "--", "true"], env=env,
                              capture_output=True, text=True, timeout=60)
    assert launched.returncode == 2, launched.stderr
    assert launched.stderr.count("\n") == 1, launched.stderr  # one line
    assert f"claims: {why}: cards cannot be chosen safely, so --gpu auto is refused" in launched.stderr, (
        why, launched.stderr)
