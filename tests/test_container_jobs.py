"""Jobs that start a container, with real engines (tests/container_lab.py): rootful Podman with a CDI
spec for the fake cards, and Docker (`--gpus`, the toolkit's hook a stand-in). The fake driver
lists a real process on the card its CUDA_VISIBLE_DEVICES names, the engine clients excepted (a
`podman run` never opens a card itself; the container's processes do): what a container sees is
what its processes' environment says.

Each escape these tests close: the pin not reaching the container, a container asking its engine
for every card, the watchdog blind to the container (its processes are conmon's or the shim's,
not the job's), and `run -d` ending the job (and its claim) while the container holds the card.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time

import container_lab
import psutil
import pytest
from conftest import GIB, Card
from container_lab import IMAGE
from test_jobs import wait_for

from gpumon.jobs import records

podman_lab, docker_lab, cdi_spec = container_lab.podman_lab, container_lab.docker_lab, container_lab.cdi_spec

pytestmark = pytest.mark.xdist_group("containers")  # one dockerd and one Podman store, not one per worker

# How a job ends ("lost" is not one: a job the TUI has just recorded, whose supervisor is starting, reads so).
DONE = ("exited", "killed", "failed", "cancelled")
# The engine clients are not GPU processes: the fake driver must not list them on the card.
CLIENTS = ("podman", "docker", "conmon", "containerd-shim", "runc")


def cards(fake_driver, count: int = 3) -> list[str]:
    """Free cards with UUIDs of this test only (scan_env lists every process pinned to a UUID)."""
    token = secrets.token_hex(2)
    uuids = [f"GPU-{i}{i}{i}{i}c0de-{token}-1111-2222-33334444555{i}" for i in range(count)]
    fake_driver.machine.scan_env = True
    fake_driver.machine.scan_env_ignore = CLIENTS
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-40GB", uuid=u, mem_total=40 * GIB,
                                      extra={"cpus": "0", "numa": 0}) for u in uuids]
    fake_driver.write()
    return uuids


def run(fake_driver, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return fake_driver.run("run", "--interval", "0.2", *args, timeout=timeout)


def jobs(fake_driver) -> list[dict]:
    return json.loads(fake_driver.run("jobs", "--json").stdout)


def ended(fake_driver) -> dict:
    return wait_for(lambda: next((j for j in jobs(fake_driver) if j["state"] in DONE), None),
                    timeout=60, what="the job's end")


def inside_env(log: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line and not line.startswith("gpumon"))


@pytest.fixture(autouse=True)
def _stop_jobs_left_running(fake_driver):
    yield
    for job in jobs(fake_driver):
        if job["state"] in ("running", "queued"):
            fake_driver.run("jobs", "--stop", job["id"])


@pytest.mark.parametrize("names", [("uuid", "index"), ("index",)])
def test_a_podman_job_gets_exactly_its_card_through_cdi(fake_driver, podman_lab, cdi_spec, monkeypatch, names):
    """A spec naming cards by UUID is asked by UUID; one naming them by index only (nvidia-ctk's
    default strategy) by the card's NVML index."""
    uuids = cards(fake_driver)
    cdi_spec(uuids, names)
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    result = run(fake_driver, "--gpu", "1", "--", *podman_lab.words, "run", "--rm", IMAGE,
                 "sh", "-c", "env; ls /dev")
    assert result.returncode == 0, result.stderr
    asked = uuids[1] if "uuid" in names else "1"
    assert f"container (podman): gpumon added --device nvidia.com/gpu={asked} (CDI)" in result.stdout
    job = ended(fake_driver)
    assert job["state"] == "exited" and job["exit_code"] == 0, job
    log = open(job["log"]).read()
    env = inside_env(log)
    assert env["CUDA_VISIBLE_DEVICES"] == uuids[1] and env["NVIDIA_VISIBLE_DEVICES"] == uuids[1]
    assert env["GPUMON_JOB_ID"] == job["id"]
    assert "nvidia1" in log.split() and "nvidia0" not in log.split() and "nvidia2" not in log.split()


def test_a_typed_command_line_with_a_container_is_pinned_too(fake_driver, podman_lab, monkeypatch):
    """The TUI's run dialog runs what was typed in the user's shell: the pin goes inside the line."""
    uuids = cards(fake_driver)
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    line = f"cd / && {podman_lab.shell()} run --rm {IMAGE} env | grep VISIBLE"
    result = run(fake_driver, "--gpu", "2", "--", "/bin/sh", "-c", line)
    assert result.returncode == 0, result.stderr
    assert "container (podman): gpumon added -e CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES" in result.stdout
    assert "(no CDI spec names the card: the NVIDIA toolkit's hook reads NVIDIA_VISIBLE_DEVICES)" in result.stdout
    job = ended(fake_driver)
    env = inside_env(open(job["log"]).read())
    assert env == {"CUDA_VISIBLE_DEVICES": uuids[2], "NVIDIA_VISIBLE_DEVICES": uuids[2]}


@pytest.mark.parametrize("request_words", [["--gpus", "all"], ["--gpus", "2"], ["--device", "nvidia.com/gpu=all"],
                                           ["-e", "NVIDIA_VISIBLE_DEVICES=all"]])
def test_a_container_that_asks_for_other_cards_is_refused(fake_driver, podman_lab, request_words):
    cards(fake_driver)
    result = run(fake_driver, "--gpu", "1", "--", *podman_lab.words, "run", "--rm", *request_words, IMAGE, "true")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "the container asks podman for" in line and "not the job's GPU 1" in line and "--as-typed" in line
    assert jobs(fake_driver) == []


def test_as_typed_starts_it_with_a_warning(fake_driver, podman_lab, monkeypatch):
    cards(fake_driver)
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    # A training script's own --gpus comes after the image: it is the container's, not the engine's.
    result = run(fake_driver, "--gpu", "0", "--as-typed", "--", *podman_lab.words, "run", "--rm",
                 "-e", "NVIDIA_VISIBLE_DEVICES=all", IMAGE, "sh", "-c", "echo --gpus 2; env")
    assert result.returncode == 0, result.stderr
    job = ended(fake_driver)
    log = open(job["log"]).read()
    assert "gpumon: the container asks podman for every card" in log and "started as typed" in log
    assert inside_env(log)["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_the_watchdog_follows_the_containers_processes(fake_driver, podman_lab, monkeypatch):
    """A container using 1 GiB against a 512M limit: its processes are conmon's, not the job's."""
    uuids = cards(fake_driver)
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    result = run(fake_driver, "--gpu", "1", "--mem-limit", "512M", "--", *podman_lab.words, "run", "--rm", IMAGE,
                 "sleep", "120")
    assert result.returncode == 0, result.stderr
    job = wait_for(lambda: next((j for j in jobs(fake_driver) if j["state"] == "killed"), None),
                   timeout=60, what="the watchdog to stop the container")
    assert job["reason"] == "memory limit exceeded on GPU 1: 1.0 GiB > 512 MiB"
    assert job["peak_gpu_memory"] == GIB
    assert podman_lab("ps", "-q") == "", "the container was stopped with its job"
    assert not [p for p in psutil.process_iter(["environ"]) if uuids[1] in str((p.info["environ"] or {}).get(
        "CUDA_VISIBLE_DEVICES"))]


def test_a_detached_container_keeps_its_job_and_its_card_until_it_ends(fake_driver, podman_lab, monkeypatch):
    cards(fake_driver, 2)
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    name = f"trainer-{secrets.token_hex(2)}"
    result = run(fake_driver, "--gpu", "auto", "--", *podman_lab.words, "run", "-d", "--name", name, IMAGE,
                 "sleep", "120")
    assert result.returncode == 0, result.stderr
    (job,) = jobs(fake_driver)
    mine = job["gpu_indices"][0]
    cid = wait_for(lambda: podman_lab("ps", "-q", "--no-trunc"), timeout=60, what="the container")
    time.sleep(1.0)  # `podman run -d` has long returned
    (job,) = jobs(fake_driver)
    assert job["state"] == "running", job
    # On its card: the container's process, named as Podman named it (its storage is not the
    # default one: conmon's argv says the name), its pid inside beside the host's, and the job's.
    inside = int(podman_lab("inspect", "-f", "{{.State.Pid}}", name))
    doc = json.loads(fake_driver.run("snapshot", "--json").stdout)
    (listed,) = [p for p in doc["gpus"][mine]["processes"] if p["pid"] == inside]
    assert (listed["owner"]["engine"], listed["owner"]["name"], listed["container_pid"]) == ("podman", name, 1)
    assert inside in {p.pid for p in records.list_jobs()[0].processes()}, "the views mark it as the job's"
    table = fake_driver.run("jobs").stdout
    assert " running " in table and "record pending" not in table, table
    # Its claim is held: the next auto placement is given the other card.
    other = run(fake_driver, "--gpu", "auto", "--", "sleep", "60")
    assert other.returncode == 0, other.stderr
    assert [j["gpu_indices"] for j in jobs(fake_driver) if j["id"] != job["id"]] == [[1 - mine]]
    # Stopping the job stops the container, through its engine.
    stopped = fake_driver.run("jobs", "--stop", job["id"])
    assert stopped.returncode == 0, stopped.stderr
    wait_for(lambda: podman_lab("ps", "-q") == "", timeout=60, what="the container to stop")
    wait_for(lambda: podman_lab("inspect", "-f", "{{.State.Status}}", cid.split()[0]) == "exited",
             timeout=60, what="the container to be stopped, not killed by signal")
    done = wait_for(lambda: next((j for j in jobs(fake_driver) if j["id"] == job["id"]
                                  and j["state"] != "running"), None), timeout=60, what="the job's end")
    assert done["state"] == "killed" and done["exit_code"] in (137, 143), "the container's status, not `run -d`'s"


def test_a_detached_container_that_ends_ends_its_job_with_its_status(fake_driver, podman_lab, monkeypatch):
    cards(fake_driver, 1)
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    result = run(fake_driver, "--gpu", "0", "--", *podman_lab.words, "run", "-d", IMAGE, "sh", "-c", "sleep 2; exit 3")
    assert result.returncode == 0, result.stderr
    time.sleep(1.0)
    assert jobs(fake_driver)[0]["state"] == "running"
    job = ended(fake_driver)
    assert (job["state"], job["exit_code"]) == ("exited", 3)


def test_a_docker_job_is_pinned_with_gpus_device_and_followed(fake_driver, docker_lab):
    uuids = cards(fake_driver)
    result = run(fake_driver, "--gpu", "2", "--mem-limit", "512M", "--", *docker_lab.words, "run", "--rm", IMAGE,
                 "sh", "-c", "env; grep _allowed_list /proc/self/status; sleep 120")
    assert result.returncode == 0, result.stderr
    assert f'container (docker): gpumon added --gpus "device={uuids[2]}"' in result.stdout
    assert "--cpuset-cpus 0; --cpuset-mems 0" in result.stdout
    job = wait_for(lambda: next((j for j in jobs(fake_driver) if j["state"] == "killed"), None),
                   timeout=60, what="the watchdog to stop the container")
    assert job["reason"] == "memory limit exceeded on GPU 2: 1.0 GiB > 512 MiB"
    log = open(job["log"]).read()
    env = inside_env(log)
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuids[2] and env["CUDA_VISIBLE_DEVICES"] == uuids[2]
    assert "Cpus_allowed_list:\t0" in log and "Mems_allowed_list:\t0" in log
    assert docker_lab("ps", "-q") == ""


def test_docker_refuses_a_count(fake_driver, docker_lab):
    cards(fake_driver)
    result = run(fake_driver, "--gpu", "0", "--", *docker_lab.words, "run", "--gpus", "1", IMAGE, "true")
    assert result.returncode == 2
    assert "the container asks docker for cards by count (the engine picks which) (--gpus 1)" in result.stderr


def test_words_after_the_image_are_the_containers_own():
    from gpumon.jobs.container_command import asked_cards, find_container

    found = find_container(["podman", "--root", "/r", "run", "-it", "--name", "x", "-v", "/a:/b", IMAGE,
                            "python", "train.py", "--gpus", "all"])
    assert found is not None and found.engine_words == ("podman", "--root", "/r") and asked_cards(found) is None
    assert find_container(["python", "-m", "docker", "run"]) is None


# Apptainer and enroot cannot be installed here: stand-ins that do what their documentation says of
# the command lines gpumon writes. Apptainer: `exec [options] IMAGE CMD`, `--cleanenv` starts from an
# empty environment, `APPTAINERENV_X=v` becomes `X=v` inside, APPTAINER_CONTAINER names the image.
# enroot: `start [options] NAME CMD`, the host's environment does not reach the container, `--env K=V`
# does.
APPTAINER = r"""#!/bin/sh
echo "apptainer $*" >> "$STANDIN_LOG"
shift
while [ $# -gt 0 ]; do
  case "$1" in --cleanenv|-e) clean=1; shift;; -B|--bind|--env|-H|--home) shift 2;; -*) shift;; *) break;; esac
done
image=$1; shift
exec env ${clean:+-i} $(env | sed -n 's/^APPTAINERENV_//p') APPTAINER_CONTAINER="$image" "$@"
"""
ENROOT = r"""#!/bin/sh
echo "enroot $*" >> "$STANDIN_LOG"
shift
vars=""
while [ $# -gt 0 ]; do
  case "$1" in -e|--env) vars="$vars $2"; shift 2;; -c|--conf|-m|--mount|--rc) shift 2;; -*) shift;; *) break;; esac
done
shift
exec env -i $vars "$@"
"""


@pytest.mark.parametrize("engine, words", [("apptainer", ["apptainer", "exec", "--cleanenv", "/img/train.sif"]),
                                           ("enroot", ["enroot", "start", "--rw", "pytorch"])])
def test_apptainer_and_enroot_get_the_pin_their_way(fake_driver, tmp_path, monkeypatch, engine, words):
    uuids = cards(fake_driver)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / engine).write_text(APPTAINER if engine == "apptainer" else ENROOT)
    (bin_dir / engine).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_LOG", str(tmp_path / "argv"))
    result = run(fake_driver, "--gpu", "1", "--mem-limit", "512M", "--", *words, "sh", "-c", "env; sleep 120")
    assert result.returncode == 0, result.stderr
    job = wait_for(lambda: next((j for j in jobs(fake_driver) if j["state"] == "killed"), None),
                   timeout=60, what="the watchdog to stop the container's process")
    assert job["reason"].startswith("memory limit exceeded on GPU 1: ")  # the stand-in and the command: 2 GiB
    env = inside_env(open(job["log"]).read())
    assert env["CUDA_VISIBLE_DEVICES"] == uuids[1] and env["NVIDIA_VISIBLE_DEVICES"] == uuids[1]
    argv = (tmp_path / "argv").read_text()
    if engine == "apptainer":
        assert argv.startswith("apptainer exec --nv --cleanenv /img/train.sif")
        assert "gpumon added --nv; APPTAINERENV_{CUDA_VISIBLE_DEVICES,NVIDIA_VISIBLE_DEVICES" in result.stdout
    else:
        assert argv.startswith(f"enroot start --env CUDA_VISIBLE_DEVICES={uuids[1]} ")
        assert "gpumon added --env CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES" in result.stdout


def test_r_with_a_container_command_pins_it_and_a_request_for_all_cards_stays_in_the_dialog(
        fake_driver, podman_lab, monkeypatch):
    """The run dialog: what was typed runs in the user's shell, the pin inside the line; a
    container asking for every card is answered in the dialog, what was typed kept."""
    from test_tui import run as run_app
    from test_tui import started
    from test_tui_host import app_on, wait_until

    from gpumon.tui.screens.run_dialog import RunDialog

    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    token = secrets.token_hex(2)
    uuids = [f"GPU-{i}{i}{i}{i}d1a1-{token}-1111-2222-33334444555{i}" for i in range(2)]
    fake_driver.machine.scan_env = True
    fake_driver.machine.scan_env_ignore = CLIENTS
    backend, app = app_on(fake_driver, [Card(uuid=u, mem_total=40 * GIB) for u in uuids])
    asks_all = f"{podman_lab.shell()} run --rm --gpus all {IMAGE} env"
    typed = f"{podman_lab.shell()} run --rm {IMAGE} env"

    async def go():
        async with app.run_test(size=(160, 40)) as pilot:
            await started(pilot)
            await pilot.press("r", *asks_all, "enter")
            assert isinstance(app.screen, RunDialog), "the dialog stays, with what was typed"
            error = str(app.screen.query_one("#run-error").render())
            assert "the container asks podman for every card (--gpus all), not the job's GPU 0" in error
            app.screen.query_one("#run-command").value = typed
            await pilot.press("enter")
            return await wait_until(pilot, lambda: next((j for j in jobs(fake_driver) if j["state"] in DONE), None),
                                    "the container job's end")

    try:
        job = run_app(go())
    finally:
        backend.close()
    log = open(job["log"]).read()
    env = inside_env(log)
    assert env.get("CUDA_VISIBLE_DEVICES") == uuids[0] and env["NVIDIA_VISIBLE_DEVICES"] == uuids[0], (job, log)


def test_failover_stops_the_container_and_starts_a_new_one_on_the_new_card(fake_driver, podman_lab, monkeypatch):
    uuids = cards(fake_driver, 2)
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    result = run(fake_driver, "--gpu", "0", "--failover", "1", "--", *podman_lab.words, "run", "--rm", IMAGE,
                 "sleep", "120")
    assert result.returncode == 0, result.stderr
    first = wait_for(lambda: podman_lab("ps", "-q", "--no-trunc"), timeout=60, what="the first container")
    fake_driver.machine.cards[0].extra["lost_after"] = 0
    fake_driver.write()

    def moved():
        (job,) = jobs(fake_driver)
        running = podman_lab("ps", "-q", "--no-trunc")
        return job if len(job["attempts"]) == 2 and job["state"] == "running" and running and running != first \
            else None

    job = wait_for(moved, timeout=60, what="the job on its new card, in a new container")
    assert job["gpu_indices"] == [1] and job["attempts"][0]["moved_because"] == "GPU 0 is lost"
    second = podman_lab("ps", "-q", "--no-trunc")
    env = podman_lab("inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}", second).splitlines()
    assert f"CUDA_VISIBLE_DEVICES={uuids[1]}" in env and f"NVIDIA_VISIBLE_DEVICES={uuids[1]}" in env
    assert first not in podman_lab("ps", "-a", "-q", "--no-trunc"), "the first container was stopped (and removed)"


def test_a_detached_container_that_could_not_be_made_ends_its_job_at_once(fake_driver, podman_lab, monkeypatch):
    cards(fake_driver, 1)
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    started = time.monotonic()
    result = run(fake_driver, "--gpu", "0", "--", *podman_lab.words, "run", "-d", "localhost/no-such-image", "true")
    assert result.returncode in (0, 1), result.stderr
    job = ended(fake_driver)
    assert job["state"] == "exited" and job["exit_code"] != 0
    assert time.monotonic() - started < 8, "no waiting for a container that was never made"


def test_a_numa_node_this_machine_cannot_use_is_not_asked_of_the_engine(fake_driver, podman_lab, monkeypatch):
    """A container asked for another node's memory would not start at all."""
    cards(fake_driver, 1)
    fake_driver.machine.cards[0].extra["numa"] = 7
    fake_driver.write()
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    result = run(fake_driver, "--gpu", "0", "--", *podman_lab.words, "run", "--rm", IMAGE, "true")
    assert result.returncode == 0, result.stderr
    assert "--cpuset-cpus 0" in result.stdout and "--cpuset-mems" not in result.stdout
    job = ended(fake_driver)
    assert (job["state"], job["exit_code"]) == ("exited", 0)


def test_a_container_on_another_hosts_engine_is_said_to_be_unwatched(fake_driver, docker_lab):
    """`docker -H tcp://…`: its processes run on that host; the limit is not pretended to apply."""
    cards(fake_driver, 1)
    result = run(fake_driver, "--gpu", "0", "--mem-limit", "8G", "--", "docker", "-H", "tcp://127.0.0.1:9", "run",
                 "--rm", IMAGE, "true")
    assert result.returncode == 0, result.stderr
    job = ended(fake_driver)
    log = open(job["log"]).read()
    assert ("gpumon: the docker container runs on another host's engine (-H tcp://127.0.0.1:9): gpumon cannot see "
            "its processes there: its memory limit, peak and energy are not watched") in log


def test_a_queued_container_job_is_pinned_to_the_card_it_gets(fake_driver, podman_lab, monkeypatch):
    uuids = cards(fake_driver, 2)
    fake_driver.machine.cards[0].extra["util"] = 90  # busy: the queue gives the job card 1
    fake_driver.write()
    monkeypatch.setenv("CONTAINERS_CONF", podman_lab.env["CONTAINERS_CONF"])
    result = run(fake_driver, "--wait", "--gpu", "auto", "--", *podman_lab.words, "run", "--rm", IMAGE, "env")
    assert result.returncode == 0, result.stderr
    job = ended(fake_driver)
    assert job["gpu_indices"] == [1] and job["exit_code"] == 0, job
    env = inside_env(open(job["log"]).read())
    assert env["CUDA_VISIBLE_DEVICES"] == uuids[1] and env["NVIDIA_VISIBLE_DEVICES"] == uuids[1]


def test_a_container_job_launched_on_another_host_is_pinned_there(ssh_lab, podman_lab):
    """`run --host`: that host's gpumon pins the container (its own summary comes back)."""
    host = ssh_lab.host("c")
    token = secrets.token_hex(2)
    uuids = [f"GPU-{i}{i}{i}{i}5511-{token}-1111-2222-33334444555{i}" for i in range(2)]
    host.machine.cards = [Card(uuid=u, mem_total=40 * GIB) for u in uuids]
    host.machine.scan_env = True
    host.machine.scan_env_ignore = CLIENTS
    host.write()
    # No CONTAINERS_CONF over ssh: its settings as the engine's options (../shared/REAL-MANAGERS.md).
    launched = ssh_lab.gpumon("run", "--host", "c", "--gpu", "1", "--", *podman_lab.words, "--runtime", "runc",
                              "--cgroup-manager", "cgroupfs", "--events-backend", "none", "run", "--rm",
                              "--network=none", "--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
                              IMAGE, "env")
    assert launched.returncode == 0, launched.stderr
    assert "container (podman): gpumon added" in launched.stdout

    def done():
        listed = json.loads(ssh_lab.gpumon("jobs", "--hosts", "c", "--json").stdout or "[]")
        return next((j for j in listed if j["state"] in DONE), None)

    job = wait_for(done, timeout=60, what="the job there to end")
    log = open(job["log"]).read()
    env = inside_env(log)
    assert env.get("CUDA_VISIBLE_DEVICES") == uuids[1] and env["NVIDIA_VISIBLE_DEVICES"] == uuids[1], (job, log)
