"""Who holds the cards of a cluster read through a real Prometheus on loopback (`--prometheus-url`):
dcgm-exporter's Kubernetes mapping names the pod holding each card (`pod`, `namespace`,
`container`), its HPC mapping the job (`hpc_job`); there are no processes. `gpumon users` (text and
JSON), the fleet TUI's users view `u` in tmux and `gpumon serve`'s /api/users list those holders per
card: a card shared by two pods counts for nobody, a card going to 0 % utilisation is idle, and a
hostile pod name is shown as text. The expositions are written in dcgm-exporter's format and served
by a small static HTTP server; nothing of gpumon's is mocked."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest
from conftest import require_tool
from promlab import Prometheus, StaticServer, wait_until
from test_fleet_prometheus_trust import card, exposition
from webpage import Served, get, until

from gpumon.sanitize import printable

MIB = 1 << 20
# A pod's name with markup and control characters (Prometheus keeps them: a label is any UTF-8).
HOSTILE = "[b]evil[/b]\x1b[31mred\x07"
K0, K1, K2, K3 = (f"GPU-0000000{i}-aaaa-4000-8000-000000000000" for i in range(4))
S0, S1, T0, T1 = (f"GPU-0000000{i}-bbbb-4000-8000-000000000000" for i in range(4))


def held(gpu: int, uuid: str, host: str, util: int, used: int, power: float, **owner: str) -> dict:
    """One card's series as dcgm-exporter writes them with a mapping: the owner's labels last."""
    series = card(gpu, uuid, host, GPU_TEMP="50", GPU_UTIL=str(util), FB_USED=str(used), FB_FREE=str(80000 - used),
                  POWER_USAGE=f"{power:.6f}")
    series["labels"].update(owner)
    return series


class Cluster:
    """Three nodes' dcgm-exporters: node-k with pod mapping, node-s and node-t with HPC job mapping.
    `util`: the utilisation of train-b's card, changed by the test."""

    def __init__(self) -> None:
        self.util = 60
        self.static = StaticServer()
        self.static.page("/k", lambda: self.node_k().encode())
        self.static.page("/s", exposition(
            held(0, S0, "node-s", 50, 30000, 250.0, hpc_job="42"),
            held(1, S1, "node-s", 0, 0, 60.0)))  # nobody's
        # This scrape target has an hpc_job label of its own: the exporter's is renamed exported_hpc_job.
        self.static.page("/t", exposition(
            held(0, T0, "node-t", 30, 10000, 150.0, hpc_job="40_3"),
            held(1, T1, "node-t", 0, 0, 60.0)))  # nobody's: only the target's own label

    def node_k(self) -> str:
        pod = {"namespace": "ml", "container": "main"}
        return exposition(
            held(0, K0, "node-k", 80, 40000, 300.0, pod="train-a", **pod, hpc_job="99"),  # the pod names it
            held(1, K1, "node-k", self.util, 20000, 200.0, pod="train-b", **pod),
            # A card shared by two pods: dcgm-exporter writes each series once per pod.
            held(2, K2, "node-k", 40, 8000, 120.0, pod="share-1", **pod),
            held(2, K2, "node-k", 40, 8000, 120.0, pod="share-2", **pod),
            held(3, K3, "node-k", 10, 1000, 90.0, pod=HOSTILE, namespace="evil", container="x"))

    def prometheus(self, binary: str, workdir) -> Prometheus:
        def target(path: str, instance: str, **labels: str) -> dict:
            return {"targets": [f"127.0.0.1:{self.static.port}"],
                    "labels": {"__metrics_path__": path, "instance": instance, **labels}}

        return Prometheus(binary, workdir, [{"job_name": "dcgm", "static_configs": [
            target("/k", "10.0.0.1:9400"), target("/s", "10.0.0.2:9400"),
            target("/t", "10.0.0.3:9400", hpc_job="exporter-node-t")]}])

    def close(self) -> None:
        self.static.close()


@pytest.fixture
def cluster(tmp_path):
    binary = require_tool("prometheus")
    lab = Cluster()
    server = lab.prometheus(binary, tmp_path)
    try:
        server.start()
        server.wait_for_series("DCGM_FI_DEV_GPU_TEMP", 4 + 1 + 2 + 2)
        yield lab, server
    finally:
        server.stop()
        lab.close()


def gpumon(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpumon", *args], capture_output=True, text=True, timeout=timeout)


def holders_of(doc: dict) -> dict[tuple[str, str, str], dict]:
    return {(h["host"], h["kind"], h["id"]): h for h in doc["holders"]}


EXPECTED = {("node-k", "k8s", "ml/train-a"), ("node-k", "k8s", "ml/train-b"),
            ("node-k", "k8s", f"evil/{printable(HOSTILE)}"), ("node-s", "slurm", "42"), ("node-t", "slurm", "40_3")}


def test_users_of_a_cluster_are_the_pods_and_jobs_its_exporters_name(cluster):
    lab, server = cluster
    out = gpumon("users", "--json", "--prometheus-url", server.url, "--interval", "0.5")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = holders_of(doc)
    # Card 2 of node-k is shared by two pods: it counts for nobody (rather than twice). node-t's card 1
    # carries only its scrape target's own hpc_job.
    assert set(rows) == EXPECTED
    a = rows["node-k", "k8s", "ml/train-a"]
    assert a == a | {"label": "ml/train-a (main)", "user": None, "cards": [0], "uuids": [K0], "processes": 0,
                     "gpu_memory": 40000 * MIB, "sm_util": 80, "power_w": 300.0, "held_s": None, "idle_s": None}
    job = rows["node-s", "slurm", "42"]
    assert (job["label"], job["cards"], job["gpu_memory"], job["sm_util"], job["power_w"]) == (
        "job 42", [0], 30000 * MIB, 50, 250.0)
    assert rows["node-t", "slurm", "40_3"]["label"] == "job 40_3"  # exported_hpc_job, an array task
    assert rows["node-k", "k8s", f"evil/{printable(HOSTILE)}"]["label"] == f"evil/{printable(HOSTILE)} (x)"
    assert [(h["host"], h["source"]) for h in doc["hosts"]] == [(n, "prometheus")
                                                               for n in ("node-k", "node-s", "node-t")]

    text = gpumon("users", "--prometheus-url", server.url, "--interval", "0.5")
    assert text.returncode == 0, text.stderr
    assert "\x1b" not in text.stdout and "\x07" not in text.stdout
    lines = text.stdout.splitlines()
    assert lines[0].split()[:3] == ["HOST", "WHO", "USER"]
    hostile = next(line for line in lines if "evil/" in line)
    assert "evil/[b]evil[/b]\\x1b[31mred" in hostile  # as text, the escape made visible (cut to its column)
    train_a = next(line for line in lines if "ml/train-a (main)" in line).split()
    assert train_a[0] == "node-k" and train_a[3:8] == ["?", "0", "39G", "80", "300W"]  # no user; card 0

    # train-b's card stops computing: idle, for as long as this run watched it.
    lab.util = 0
    server.wait_for_series('DCGM_FI_DEV_GPU_UTIL{UUID="%s"} == 0' % K1, 1)
    out = gpumon("users", "--json", "--prometheus-url", server.url, "--interval", "0.5", "--window", "3s")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = holders_of(doc)
    b = rows["node-k", "k8s", "ml/train-b"]
    assert doc["window_s"] >= 2.5
    assert b["sm_util"] == 0 and b["idle_s"] is not None and b["idle_s"] >= 2.0 and b["idle_s"] <= b["watched_s"]
    assert rows["node-k", "k8s", "ml/train-a"]["idle_s"] is None


def test_the_fleet_tui_users_view_and_serve_api_users(cluster, tmux_session, tmp_path):
    _, server = cluster
    status = tmp_path / "status"
    tmux = tmux_session(160, 30)
    tmux.start(f"env TERM=xterm-256color {shlex.join([sys.executable, '-m', 'gpumon', '--prometheus-url', server.url])}"
               f"; echo $? > {status}")
    tmux.wait_for(lambda s: "3 hosts: 3 live" in s, timeout=60, what="the nodes live")
    tmux.keys("u")
    screen = tmux.wait_for(lambda s: "ml/train-a (main)" in s and "job 40_3" in s, timeout=30,
                           what="the pods and jobs")
    assert "share-1" not in screen and "share-2" not in screen
    assert "evil/[b]evil[/b]\\x1b[31m" in screen  # the hostile name as text
    job = next(line for line in screen.splitlines() if "job 42" in line)
    assert "node-s" in job and "29G" in job
    tmux.keys("Escape")
    tmux.wait_for(lambda s: "3 hosts: 3 live" in s, what="back on the overview")
    tmux.keys("q")
    wait_until(status.exists, 20, "the TUI to quit")
    assert status.read_text().strip() == "0"

    argv = [sys.executable, "-m", "gpumon", "serve", "--listen", "127.0.0.1:0", "--prometheus-url", server.url,
            "--interval", "0.5"]
    with Served(argv, dict(os.environ)) as served:
        def holders() -> dict | None:
            status, _, body = get(served.base + "/api/users")
            doc = json.loads(body) if status == 200 else {"holders": []}
            return doc if {(h["host"], h["kind"], h["id"]) for h in doc["holders"]} == EXPECTED else None

        doc = until(holders, 30, "the cluster's holders in /api/users")
    rows = holders_of(doc)
    assert rows["node-k", "k8s", "ml/train-a"]["label"] == "ml/train-a (main)"
    assert rows["node-s", "slurm", "42"]["gpu_memory"] == 30000 * MIB
    assert [h["host"] for h in doc["hosts"]] == ["node-k", "node-s", "node-t"]
