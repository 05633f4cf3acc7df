"""Who runs a process and who holds a card, in the exposition: dcgm-exporter's labels `hpc_job`,
`pod`, `namespace`, `container`, worked out from the snapshot at scrape time (the owners were read
once per process by owners/reader; nothing is read here).

- A Slurm job: `hpc_job` is the job as Slurm names it, `JOBID`, or `ARRAYJOB_TASK` for an array
  task, without the step: a job holds its cards whatever step runs on them, and `sum by (hpc_job)`
  must add up its steps. dcgm-exporter copies `hpc_job` from its mapping files, where a prolog
  usually writes `$SLURM_JOB_ID`: the same for plain jobs; an array task's raw id is not kept by
  gpumon. A card mapped to several jobs (`[owners] job_map_dir`) leaves it empty: dcgm-exporter
  would repeat every series once per job, and sums over jobs would count the card twice.
- A Kubernetes pod: `pod` and `namespace` are its names and `container` the container's name, as
  dcgm-exporter's pod mapping puts them (empty where the kubelet's records do not name them).
- A Docker or Podman container: `container` is the engine's name for it (else its short id).
- Anything else (a systemd unit, a plain user): all four empty.

Each family keeps one set of label names (empty values where not known: Prometheus reads an empty
label as no label, so dashboards that do not use them see no change).
"""

from __future__ import annotations

from gpumon.model import GpuSample, ProcessOwner

OWNER_LABELS = ["hpc_job", "pod", "namespace", "container"]
Labels = tuple[str, str, str, str]
NOBODY: Labels = ("", "", "", "")


def process_labels(owner: ProcessOwner | None) -> Labels:
    """The owner labels of a process (None: a process gpumon cannot see)."""
    if owner is None:
        return NOBODY
    if owner.kind == "slurm":
        if "," in owner.id:  # a card mapped to several jobs: whose this process is, nobody says
            return NOBODY
        return (owner.id.split(".", 1)[0], "", "", "")
    if owner.kind == "k8s":
        return pod_labels(owner.name)
    if owner.kind == "container":
        return ("", "", "", owner.name or owner.id)
    return NOBODY


def pod_labels(name: str | None) -> Labels:
    """`namespace/pod (container)` (model.ProcessOwner.name, GpuSample.owner) as labels. Kubernetes
    names are DNS labels, without '/', ' ' or '(': the parts are unambiguous."""
    if not name or ", " in name:  # unnamed, or several pods on one card
        return NOBODY
    rest, _, container = name.partition(" (")
    namespace, _, pod = rest.rpartition("/")
    return ("", pod, namespace, container.removesuffix(")"))


def card_labels(g: GpuSample) -> Labels:
    """The labels of a card held by exactly one job, pod or container; empty for a card with none
    or several (a process of another owner, or one gpumon cannot see, counts as another). A pod's
    containers sharing its card: the pod's labels without a container. `GpuSample.owner` (a
    source that names the card's pod or job, dcgm-exporter through Prometheus: "job 42") wins where
    it is given."""
    if g.owner is not None:
        if g.owner.startswith("job ") and ", " not in g.owner:
            return (g.owner[4:], "", "", "")
        return pod_labels(g.owner)
    held = {process_labels(p.owner) for p in g.processes}
    if len(held) == 1:
        return held.pop()
    pods = {labels[:3] for labels in held}
    if len(pods) == 1 and (one := pods.pop())[1]:
        return (*one, "")
    return NOBODY
