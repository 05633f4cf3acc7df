"""Who is using the GPUs, in the Prometheus exposition: dcgm-exporter's `hpc_job`, `pod`,
`namespace`, `container` on each process's series and on the series of a card one job, pod or
container holds. Real processes in real Slurm, kubepods and Docker shaped cgroups
(tests/cgroup_lab.py), listed on cards by the fake driver, scraped over HTTP from the real
`gpumon watch --prometheus` (one host, and a fleet over a real sshd) and by a real Prometheus."""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest
from cgroup_lab import cgroup_lab  # noqa: F401 - the fixture
from conftest import GIB, Card, require_tool
from prometheus_client.parser import text_string_to_metric_families
from promlab import Exporter, Prometheus, free_port, scrape_job, wait_until
from test_owners_cgroups import MAPPED_CARD, hexid, host_records, uid, write_config
from test_prometheus import check_metrics

from gpumon.alerting.prometheus_rules import prometheus_rules
from gpumon.alerting.rules import parse_rules

OWNER = ("hpc_job", "pod", "namespace", "container")
NOBODY = ("", "", "", "")
POD = ("", "trainer-7f9c", "ml", "main")

# (name, hierarchy, cgroup under the test root, environment, card, the process's labels)
PROCESSES = [
    ("job 42 step 0", "v1", "slurm/uid_0/job_42/step_0/task_0", {}, 0, ("42", "", "", "")),
    ("job 42 batch", "v2", "system.slice/slurmstepd.scope/job_42/step_batch", {}, 0, ("42", "", "", "")),
    ("array task 40_3", "v1", "slurm/uid_0/job_43/step_0/task_0",
     {"SLURM_JOB_ID": "43", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}, 1, ("40_3", "", "", "")),
    ("pod", "v1", f"kubepods/burstable/pod{uid(1)}/{hexid(1)}", {}, 2, POD),
    ("mapped", "v2", "plain", {}, MAPPED_CARD, ("4242", "", "", "")),  # the prolog's job file names card 3
    ("shared job 46", "v2", "system.slice/slurmstepd.scope/job_46/step_0/user/task_0", {}, 4, ("46", "", "", "")),
    ("shared job 47", "v1", "slurm/uid_0/job_47/step_0/task_0", {}, 4, ("47", "", "", "")),
    ("docker", "v1", f"docker/{hexid(7)}", {}, 5, ("", "", "", "llama")),
]
# Who holds each card: one job (two of its steps), an array task, a pod, a mapped job, two jobs, a
# container, nobody.
CARDS = {0: ("42", "", "", ""), 1: ("40_3", "", "", ""), 2: POD, 3: ("4242", "", "", ""), 4: NOBODY,
         5: ("", "", "", "llama"), 6: NOBODY}


@pytest.fixture
def held(cgroup_lab, idle_processes, fake_driver, tmp_path):  # noqa: F811 - the fixture imported above
    """PROCESSES in their cgroups on the fake driver's cards; -> (pid by name, config path)."""
    pids = {}
    for name, which, relative, environment, _, _ in PROCESSES:
        env = ["env", *(f"{k}={v}" for k, v in environment.items())] if environment else []
        proc = idle_processes(*env, "sleep", "600")
        cgroup_lab.place(cgroup_lab.v1 if which == "v1" else cgroup_lab.v2, relative, proc.pid)
        pids[name] = proc.pid
    fake_driver.machine.cards = [Card() for _ in CARDS]
    fake_driver.machine.procs = [dict(gpu=card, pid=pids[name], mem=(i + 1) * GIB)
                                 for i, (name, _, _, _, card, _) in enumerate(PROCESSES)]
    fake_driver.write()
    return pids, write_config(tmp_path, host_records(tmp_path / "host"))


def scrape(target: str) -> bytes:
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as response:
        return response.read()


def labelled(target: str) -> bytes | None:
    """The exposition once the exporter has read the owners (the first samples can predate them)."""
    try:
        body = scrape(target)
    except OSError:
        return None
    return body if b'hpc_job="4242"' in body and b'pod="trainer-7f9c"' in body else None


def owner_of(labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(labels[k] for k in OWNER)


def check_owner_labels(body: bytes, pids: dict[str, int], host: str) -> None:
    """Every process and card series of `host` carries the four labels, with the expected values."""
    check_metrics(body)
    processes, cards = {}, {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.labels.get("Hostname") != host or "gpu" not in sample.labels:
                continue
            if family.name == "gpumon_alert_firing":  # a rule's state, not a reading of the card
                continue
            assert set(OWNER) <= set(sample.labels), (family.name, sample.labels)
            if "pid" in sample.labels:
                processes[int(sample.labels["pid"])] = owner_of(sample.labels)
            else:
                cards.setdefault(int(sample.labels["gpu"]), set()).add((family.name, owner_of(sample.labels)))
    assert processes == {pids[name]: labels for name, *_, labels in PROCESSES}
    for card, labels in CARDS.items():
        names = {name for name, _ in cards[card]}
        assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED", "gpumon_gpu_lost", "gpumon_gpu_processes"} <= names
        assert cards[card] == {(name, labels) for name in names}, card


def test_the_exporter_labels_processes_and_held_cards_with_their_job_pod_or_container(held, fake_driver):
    pids, config = held
    exporter = Exporter({**fake_driver.env, "GPUMON_CONFIG": str(config)}, "node-1", processes=True).start()
    try:
        check_owner_labels(wait_until(lambda: labelled(exporter.target), 60, "owners on the exporter"), pids,
                           "node-1")
    finally:
        assert exporter.stop() == 0


def test_cards_carry_their_owner_without_per_process_series(held, fake_driver):
    """Who holds a card is a label of the card's series whether or not processes are exported."""
    _, config = held
    exporter = Exporter({**fake_driver.env, "GPUMON_CONFIG": str(config)}, "node-1", processes=False).start()
    try:
        def card_labelled():
            try:
                body = scrape(exporter.target)
            except OSError:
                return None
            return body if b'hpc_job="4242"' in body else None

        body = wait_until(card_labelled, 60, "a card's owner on the exporter")
        assert b"gpumon_process_gpu_memory_bytes" not in body
    finally:
        assert exporter.stop() == 0


def test_prometheus_splits_cards_and_memory_by_job_and_pod(held, fake_driver, tmp_path):
    pids, config = held
    prometheus = require_tool("prometheus")
    exporter = Exporter({**fake_driver.env, "GPUMON_CONFIG": str(config)}, "node-1", processes=True).start()
    server = Prometheus(prometheus, tmp_path, [scrape_job("gpumon", [exporter.target])])
    try:
        server.start()
        by_job = server.wait_for_series("sum by (hpc_job) (gpumon_process_gpu_memory_bytes)", 6)
        assert {r["metric"].get("hpc_job", ""): float(r["value"][1]) / GIB for r in by_job} == {
            "42": 1 + 2, "40_3": 3, "4242": 5, "46": 6, "47": 7, "": 4 + 8}
        cards = server.query("count by (hpc_job) (DCGM_FI_DEV_GPU_TEMP)")
        assert {r["metric"].get("hpc_job", ""): r["value"][1] for r in cards} == {
            "42": "1", "40_3": "1", "4242": "1", "": "4"}
        pods = server.query('count by (namespace, pod, container) (DCGM_FI_DEV_FB_USED{pod!=""})')
        assert [r["metric"] for r in pods] == [{"namespace": "ml", "pod": "trainer-7f9c", "container": "main"}]
    finally:
        server.stop()
        assert exporter.stop() == 0


def test_the_fleet_exporter_labels_every_hosts_processes_and_cards(cgroup_lab, idle_processes, ssh_lab,  # noqa: F811
                                                                     tmp_path):
    """`watch --hosts … --prometheus`: the remote gpumon reads its processes' owners (its own
    config names its pod directories) and sends them in the stream; the fleet's exporter labels
    that host's series with them."""
    pids = {}
    for name, which, relative, environment, _, _ in PROCESSES:
        env = ["env", *(f"{k}={v}" for k, v in environment.items())] if environment else []
        proc = idle_processes(*env, "sleep", "600")
        cgroup_lab.place(cgroup_lab.v1 if which == "v1" else cgroup_lab.v2, relative, proc.pid)
        pids[name] = proc.pid
    config = write_config(tmp_path, host_records(tmp_path / "host"))
    host = ssh_lab.host("gpu01", env={"GPUMON_CONFIG": str(config)})
    host.machine.cards = [Card() for _ in CARDS]
    host.machine.procs = [dict(gpu=card, pid=pids[name], mem=(i + 1) * GIB)
                          for i, (name, _, _, _, card, _) in enumerate(PROCESSES)]
    host.write()
    port = free_port()
    watch = subprocess.Popen(ssh_lab.gpumon_argv("watch", "--hosts", "gpu01", "--interval", "0.3", "--prometheus",
                                                 str(port), "--prometheus-processes"),
                             env=ssh_lab.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        body = wait_until(lambda: labelled(f"127.0.0.1:{port}"), 60, "gpu01's owners on the fleet exporter")
        check_owner_labels(body, pids, "gpu01")
        watch.terminate()
        assert watch.wait(30) == 0
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(10)
        watch.stderr.close()


def test_an_exported_alert_goes_on_firing_when_the_job_on_its_card_changes(tmp_path):
    """The card's series change their labels when another job takes the card (or its job ends,
    after a fatal XID): the exported rules are about the card, as gpumon's own, so an alert that
    held keeps firing under the same labels instead of resolving and starting over."""
    promtool = require_tool("promtool")
    (tmp_path / "rules.yml").write_text(prometheus_rules(parse_rules(["temp > 85 for 30s", "xid"])))
    card = ('gpu="0",UUID="GPU-1",device="nvidia0",modelName="NVIDIA H100",Hostname="node1",'
            'pci_bus_id="00000000:17:00.0",vendor="nvidia"')
    exp_labels = {"severity": "warning", "gpu": "0", "UUID": "GPU-1", "device": "nvidia0",
                  "modelName": "NVIDIA H100", "Hostname": "node1", "pci_bus_id": "00000000:17:00.0", "vendor": "nvidia"}
    job, after = f'{card},hpc_job="42"', f'{card},hpc_job=""'
    temp = {"exp_labels": exp_labels, "exp_annotations": {
        "summary": "gpumon rule 'temp > 85 for 30s' on GPU 0 (NVIDIA H100)", "rule": "temp > 85 for 30s"}}
    xid = {"exp_labels": {**exp_labels, "xid": "79"}, "exp_annotations": {
        "summary": "gpumon rule 'xid' on GPU 0 (NVIDIA H100): XID 79", "rule": "xid"}}
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s",
        "input_series": [
            # 90 °C from the start; job 42 ends at 60 s (its series go stale), the card goes on unheld.
            {"series": f"DCGM_FI_DEV_GPU_TEMP{{{job}}}", "values": "90 90 90 90 stale"},
            {"series": f"DCGM_FI_DEV_GPU_TEMP{{{after}}}", "values": "_ _ _ _ 90 90 90 90"},
            # An XID 79 at 30 s, the same event under the card's new labels once the job is gone.
            {"series": f'gpumon_xid_last_timestamp_seconds{{{job},xid="79"}}', "values": "_ _ 30 30 stale"},
            {"series": f'gpumon_xid_last_timestamp_seconds{{{after},xid="79"}}', "values": "_ _ _ _ 30 30 30 30"},
        ],
        "alert_rule_test": [
            {"eval_time": "45s", "alertname": "GpumonTemp1", "exp_alerts": [temp]},
            {"eval_time": "75s", "alertname": "GpumonTemp1", "exp_alerts": [temp]},
            {"eval_time": "45s", "alertname": "GpumonXid2", "exp_alerts": [xid]},
            {"eval_time": "90s", "alertname": "GpumonXid2", "exp_alerts": [xid]},
        ],
    }]}
    (tmp_path / "test.yml").write_text(json.dumps(test))
    out = subprocess.run([promtool, "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_cards_read_through_prometheus_keep_their_pod_on_the_fleet_exporter():
    """A host read through Prometheus (dcgm-exporter's pod mapping: the card's pod by name, no
    processes' owners) is exported again by `watch --hosts … --prometheus` with the same labels; a
    card two pods share has none; a card its HPC job mapping names (`hpc_job`) keeps its job."""
    from promlab import exposition

    from gpumon.exporter.collector import FleetCollector, Reading
    from gpumon.fleet.prometheus.dcgm import read_cluster

    def card(gpu: int, **owner: str) -> tuple[dict[str, str], float]:
        return {"Hostname": "node-a", "gpu": str(gpu), "UUID": f"GPU-{gpu}", "modelName": "NVIDIA A100", **owner}, 0.0

    pytorch = dict(pod="train-llama-7f9c6d-x2x4q", namespace="ml-team", container="pytorch")
    cluster = read_cluster(0.0, [card(0, **pytorch), card(1), card(2, pod="a", namespace="x", container="c"),
                                 card(2, pod="b", namespace="x", container="c"), card(3, hpc_job="40_3")],
                           [], [], [])
    snapshot = cluster.hosts["node-a"].snapshot()
    body = exposition(FleetCollector(lambda: ([Reading("node-a", snapshot)], {"node-a": True})))
    check_metrics(body)
    lost = {s.labels["gpu"]: owner_of(s.labels) for f in text_string_to_metric_families(body.decode())
            if f.name == "gpumon_gpu_lost" for s in f.samples}
    assert lost == {"0": ("", "train-llama-7f9c6d-x2x4q", "ml-team", "pytorch"), "1": NOBODY, "2": NOBODY,
                    "3": ("40_3", "", "", "")}
