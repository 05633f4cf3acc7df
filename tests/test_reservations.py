"""Reservations: a user books cards for a while; everyone else's placement skips them, the
holder's prefers them; they end at their time, or unused, with an event for watch's hooks."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import time

import pytest
from conftest import GIB, Card
from prometheus_client import generate_latest
from test_claims import jobs, wait_for

from gpumon.cards.sampler import sample_once
from gpumon.exporter.collector import GpumonCollector, registry_for


def cards(fake_driver, n: int = 3) -> None:
    fake_driver.machine.cards = [
        Card("NVIDIA A40", uuid=f"GPU-{i}{i}{i}{i}eeee-1111-2222-3333-44445555666{i}",
             bus=f"00000000:{0x51 + i:02X}:00.0", mem_total=48 * GIB, extra=dict(mem_used=(n - i) * GIB // 4, util=0))
        for i in range(n)]
    fake_driver.write()


def listed(fake_driver) -> list[dict]:
    result = fake_driver.run("reserve", "--list", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["reservations"]


def test_reserve_list_prefer_release(fake_driver):
    cards(fake_driver)
    made = fake_driver.run("reserve", "--gpu", "0", "--for", "2h", "--note", "<b>[red]paper[/red]</b>")
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("reserved GPU 0 (GPU-0000eeee") and "(2h00m)" in made.stdout
    (r,) = listed(fake_driver)
    assert r["index"] == 0 and r["user"] == "root" and r["note"] == "<b>[red]paper[/red]</b>"
    assert 7100 < r["until"] - time.time() <= 7200
    assert 'GPU 0  reserved by root until ' in fake_driver.run("reserve", "--list").stdout
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    assert doc["gpus"][0]["reservation"]["note"] == r["note"] and doc["gpus"][1]["reservation"] is None
    # The holder's auto placement prefers the reserved card over the less loaded ones.
    try:
        assert fake_driver.run("run", "--", "sleep", "60").returncode == 0
        assert jobs(fake_driver)[0]["gpu_indices"] == [0]
    finally:
        fake_driver.run("jobs", "--stop", jobs(fake_driver)[0]["id"])
    released = fake_driver.run("release", "--gpu", "0")
    assert released.returncode == 0 and released.stdout.startswith("released GPU 0")
    assert listed(fake_driver) == []
    assert "no reservation" in fake_driver.run("release").stdout


def test_a_reservation_may_last_days_and_its_end_says_its_day_everywhere(fake_driver):
    cards(fake_driver, 1)
    made = fake_driver.run("reserve", "--gpu", "0", "--for", "2d")
    assert made.returncode == 0 and "(2d0h)" in made.stdout, made.stderr
    (r,) = listed(fake_driver)
    assert 2 * 86400 - 100 < r["until"] - time.time() <= 2 * 86400
    until = time.strftime("%a %H:%M", time.localtime(r["until"]))
    assert f"until {until} (2d0h)" in made.stdout
    assert f"GPU 0  reserved by root until {until}" in fake_driver.run("reserve", "--list").stdout


def test_a_reservation_ends_by_itself_at_its_time(fake_driver):
    cards(fake_driver, 1)
    assert fake_driver.run("reserve", "--gpu", "0", "--for", "1s").returncode == 0
    wait_for(lambda: listed(fake_driver) == [], what="the reservation to end")


@pytest.mark.parametrize("args, words", [
    (["--gpu", "auto", "--for", "1h"], "name the cards to reserve"),
    (["--gpu", "0", "--for", "200h"], "a reservation lasts at most a week (7d)"),
    (["--gpu", "0", "--for", "2w"], "a reservation lasts at most a week (7d)"),
    (["--gpu", "0"], "needs --gpu N[,M...] and --for DURATION"),
    (["--gpu", "9", "--for", "1h"], "no card 9"),
    (["--json"], "--json goes with --list"),
    (["--list", "--gpu", "0"], "not with --gpu"),
    (["--gpu", "0", "--for", "1h", "--note", "x" * 300], "at most 200"),
])
def test_bad_reserve_input_is_one_line_and_exit_2(fake_driver, args, words):
    cards(fake_driver, 1)
    result = fake_driver.run("reserve", *args)
    assert result.returncode == 2 and words in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_an_unused_reservation_is_released_with_an_event_for_hooks(fake_driver, tmp_path):
    cards(fake_driver, 1)
    config = tmp_path / "config.toml"
    config.write_text('[claims]\nidle_release = "1s"\n')
    hook_out = tmp_path / "hook.json"
    hook = f"{sys.executable} -c \"import json, os, sys; json.dump(dict(os.environ), open('{hook_out}', 'w'))\""
    watch = subprocess.Popen([sys.executable, "-m", "gpumon", "--config", str(config), "watch", "--interval", "0.2",
                              "--format", "jsonl", "--on-alert", hook], env=fake_driver.env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert fake_driver.run("--config", str(config), "reserve", "--gpu", "0", "--for", "1h",
                               "--note", "$(rm -rf /)").returncode == 0
        # The event's line, within a bound: a watch that never prints it fails the test, never hangs it.
        ready, _, _ = select.select([watch.stdout], [], [], 60)
        assert ready, "watch printed no event within 60 s"
        line = json.loads(watch.stdout.readline())
        assert line["event"] == "reservation_released" and line["gpu"] == 0
        assert line["user"] == "root" and line["reason"] == "unused for 1s" and line["note"] == "$(rm -rf /)"
        env = wait_for(lambda: hook_out.exists() and hook_out.stat().st_size and json.loads(hook_out.read_text()),
                       what="the hook")
        assert env["GPUMON_EVENT"] == "reservation_released" and env["GPUMON_NOTE"] == "$(rm -rf /)"
        assert listed(fake_driver) == []
    finally:
        watch.terminate()
        watch.wait(10)


def test_the_exporter_says_which_cards_are_reserved(fake_driver, monkeypatch):
    cards(fake_driver, 2)
    assert fake_driver.run("reserve", "--gpu", "1", "--for", "1h").returncode == 0
    from gpumon.cards.backends import open_backend

    backend = open_backend(nvml_lib=str(fake_driver.lib))
    try:
        snapshot = sample_once(backend)
    finally:
        backend.close()
    text = generate_latest(registry_for(GpumonCollector(lambda: snapshot, hostname="h1"))).decode()
    lines = [line for line in text.splitlines() if line.startswith("gpumon_gpu_reserved{")]
    assert len(lines) == 2
    assert any('gpu="1"' in line and 'user="root"' in line and line.endswith(" 1.0") for line in lines)
    assert any('gpu="0"' in line and 'user=""' in line and line.endswith(" 0.0") for line in lines)


def test_the_hosts_idle_release_is_the_system_files_and_a_users_own_may_only_shorten_theirs(tmp_path, monkeypatch):
    from gpumon.config import load_config
    from gpumon.settings import settings_from

    system, user = tmp_path / "system.toml", tmp_path / "user.toml"
    system.write_text('[claims]\nidle_release = "10m"\n')
    user.write_text('[claims]\nidle_release = "1h"\n')
    monkeypatch.setenv("GPUMON_SYSTEM_CONFIG", str(system))
    shared = settings_from(load_config(str(user))).sharing
    assert (shared.idle_release_s, shared.own_idle_release_s, shared.recorded_idle_release) == (600, 3600, None)
    user.write_text('[claims]\nidle_release = "1m"\n')
    assert settings_from(load_config(str(user))).sharing.recorded_idle_release == 60
    monkeypatch.setenv("GPUMON_SYSTEM_CONFIG", str(tmp_path / "none.toml"))  # no system file: the default
    assert settings_from(load_config(str(user))).sharing.idle_release_s == 30 * 60


def test_a_reservation_ends_unused_by_the_shorter_of_its_own_release_and_the_hosts(tmp_path):
    from gpumon.sharing import reservations

    place = tmp_path / "claims"
    place.mkdir(mode=0o1777)
    now = time.time()
    for card, asked in (("GPU-short", 60.0), ("GPU-long", 7200.0), ("GPU-none", None)):
        reservations.reserve(place, [(card, 0)], now + 86400, "", asked)
    # Read as if unused for 2 minutes, then 20: by the host's 10 minutes, whatever a record asks beyond.
    assert set(reservations.read(place, idle_release=600.0, now=now + 120)) == {"GPU-long", "GPU-none"}
    ended: list[reservations.Ended] = []
    assert reservations.read(place, idle_release=600.0, now=now + 1200, ended=ended) == {}
    assert {(e.reservation.card, e.reservation.idle_release) for e in ended} == {("GPU-long", 600.0),
                                                                                  ("GPU-none", 600.0)}
