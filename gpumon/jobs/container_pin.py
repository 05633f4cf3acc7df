"""What gpumon adds to a command that starts a container, so that the container lands on the job's
cards (jobs/container_command.py reads the command; this says what goes after its subcommand).

The environment gpumon pins a job with stops at a container's edge: Docker, Podman and nerdctl
start the container from a daemon or `conmon`, with the image's environment, and the NVIDIA
toolkit hands it whatever cards the engine is asked for. So the command itself is changed, the
way each engine understands, right after its `run` (before the image: what follows the image is
the container's own command, whose `--gpus` is a training script's, not the engine's):

- Podman and nerdctl: CDI `--device nvidia.com/gpu=<UUID>` where a CDI spec names the card (what
  `nvidia-ctk cdi generate` writes to /etc/cdi or /var/run/cdi); Docker and nerdctl without one:
  `--gpus "device=<UUID>,..."` (the toolkit's hook); Podman without one: only
  `NVIDIA_VISIBLE_DEVICES`, which the toolkit's legacy OCI hook reads.
- Always `-e` the pin (CUDA_VISIBLE_DEVICES by UUID, NVIDIA_VISIBLE_DEVICES, GPUMON_JOB_ID) and the
  memory-limit variables, `--cpuset-cpus` and `--cpuset-mems` for the cards' CPUs and NUMA memory
  where a daemon starts the container
  (rootless Podman's conmon inherits the job's affinity instead: it has no cgroup to set), and
  `--cidfile` so the supervisor can follow the container (jobs/container_processes.py).
- Apptainer/Singularity: `--nv` and the variables as `APPTAINERENV_…`/`SINGULARITYENV_…` (set in
  the job's environment: they reach the container even with `--cleanenv`). enroot: `--env K=V`.

"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpumon.jobs.container_command import CDI_KIND, ContainerCommand
from gpumon.units import format_cpu_list, parse_cpu_list

CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
_MAX_SPEC = 4 << 20  # a CDI spec larger than this is not read


@dataclass
class Added:
    """What gpumon adds to a container command: words after its subcommand, variables for the job's
    own environment (Apptainer's), and what it added for people (the job's one-line summary)."""

    words: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    shown: list[str] = field(default_factory=list)
    cidfile: str | None = None
    note: str = ""  # what the additions leave to the engine's set-up

    def summary(self, engine: str) -> str:
        return f"container ({engine}): gpumon added " + "; ".join(self.shown) + (f" ({self.note})" if self.note else "")


def cdi_names(dirs: Iterable[Path] = CDI_DIRS) -> set[str]:
    """The device names CDI specs give NVIDIA cards (`nvidia.com/gpu=NAME`); JSON or YAML specs."""
    names: set[str] = set()
    for directory in dirs:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        for path in entries:
            if path.suffix not in (".json", ".yaml", ".yml"):
                continue
            try:
                if not path.is_file() or path.stat().st_size > _MAX_SPEC:
                    continue
                text = path.read_text(errors="replace")
            except OSError:
                continue
            names |= _spec_names(text, path.suffix == ".json")
    return names


_YAML_KIND = re.compile(r"^kind:\s*['\"]?([^'\"\s]+)", re.M)
_YAML_NAME = re.compile(r"^\s*-\s*name:\s*['\"]?([^'\"\s]+)", re.M)


def _spec_names(text: str, is_json: bool) -> set[str]:
    if is_json:
        try:
            spec = json.loads(text)
            if spec.get("kind") != CDI_KIND:
                return set()
            return {str(d.get("name")) for d in spec.get("devices") or [] if isinstance(d, dict)}
        except (ValueError, AttributeError):
            return set()
    kind = _YAML_KIND.search(text)  # nvidia-ctk writes YAML: its device list is all this needs
    return set(_YAML_NAME.findall(text)) if kind and kind.group(1) == CDI_KIND else set()


def cdi_device_names(refs: Sequence[str], indices: Sequence[int], names: set[str]) -> list[str]:
    """The CDI names of the job's cards, [] unless a spec names every one: its UUID where the spec
    has it (`nvidia-ctk cdi generate --device-name-strategy=uuid`), else a whole card's NVML index
    (the default strategy's names; a MIG slice's index would be its card's, so never for those)."""
    out = []
    for ref, index in zip(refs, indices):
        if ref in names:
            out.append(ref)
        elif ref.startswith("GPU-") and str(index) in names:
            out.append(str(index))
        else:
            return []
    return out


def additions(container: ContainerCommand, refs: Sequence[str], variables: dict[str, str],
              cpus: Sequence[int] | None, cidfile: Path, keep_request: bool = False, mems: Sequence[int] = (),
              indices: Sequence[int] = (),
              cdi: set[str] | None = None) -> Added:
    """What to add after the subcommand. `variables`: what the job's own environment gets (the pin,
    the limit's variables), to pass inside; `keep_request`: the command's own GPU request stays (it
    names the job's cards, or --as-typed) and none is added."""
    inside = {k: v for k, v in variables.items() if k != "PYTHONPATH"}  # a host path means nothing inside
    inside.setdefault("NVIDIA_VISIBLE_DEVICES", ",".join(refs))
    family = container.family
    if family == "apptainer":
        nv = [] if _has(container, "--nv", "--nvccli") else ["--nv"]
        env = {f"{p}{k}": v for k, v in inside.items() for p in ("APPTAINERENV_", "SINGULARITYENV_")}
        prefix = "SINGULARITYENV_" if container.engine == "singularity" else "APPTAINERENV_"
        return Added(nv, env, nv + [prefix + "{" + ",".join(_shown(inside)) + "}"])
    if family == "enroot":
        return Added([w for k, v in inside.items() for w in ("--env", f"{k}={v}")],
                     shown=["--env " + " ".join(_shown(inside))])
    added = Added()
    if not keep_request:
        named = cdi_device_names(refs, indices, cdi if cdi is not None else cdi_names())
        if family in ("podman", "nerdctl") and named:
            for name in named:
                added.words += ["--device", f"{CDI_KIND}={name}"]
            added.shown.append(f"--device {CDI_KIND}=" + ",".join(named) + " (CDI)")
            if "NVIDIA_VISIBLE_DEVICES" not in variables:  # the spec sets it (nvidia-ctk's: `void`, for the hook)
                inside.pop("NVIDIA_VISIBLE_DEVICES")
        elif family in ("docker", "nerdctl"):
            added.words += ["--gpus", '"device=' + ",".join(refs) + '"']
            added.shown.append('--gpus "device=' + ",".join(refs) + '"')
        else:
            added.note = "no CDI spec names the card: the NVIDIA toolkit's hook reads NVIDIA_VISIBLE_DEVICES"
    for key, value in inside.items():
        added.words += ["-e", f"{key}={value}"]
    added.shown.append("-e " + " ".join(_shown(inside)))
    cgroup = not (family == "podman" and _rootless())
    if cpus and cgroup and not _has(container, "--cpuset-cpus"):
        added.words += ["--cpuset-cpus", format_cpu_list(cpus)]
        added.shown.append(f"--cpuset-cpus {format_cpu_list(cpus)}")
    if mems and cgroup and not _has(container, "--cpuset-mems"):
        added.words += ["--cpuset-mems", format_cpu_list(mems)]
        added.shown.append(f"--cpuset-mems {format_cpu_list(mems)}")
    if _has(container, "--cidfile"):
        added.cidfile = container.values("--cidfile")[0]
    else:
        added.words += ["--cidfile", str(cidfile)]
        added.cidfile = str(cidfile)
    return added


def usable_nodes(nodes: Iterable[int | None], status: Path = Path("/proc/self/status")) -> list[int]:
    """The cards' NUMA nodes that this process may allocate memory on (a container asked for
    another node's memory would not start)."""
    try:
        allowed = next((line.split(":", 1)[1] for line in status.read_text().splitlines()
                        if line.startswith("Mems_allowed_list:")), "")
    except OSError:
        return []
    mine = set(parse_cpu_list(allowed.strip())) if allowed.strip() else set()
    return sorted({n for n in nodes if n is not None and n >= 0 and n in mine})


def _shown(variables: dict[str, str]) -> list[str]:
    order = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "GPUMON_JOB_ID")
    return [k for k in order if k in variables] + sorted(k for k in variables if k not in order)


def _has(container: ContainerCommand, *names: str) -> bool:
    return any(option in names for option, _ in container.options)


def _rootless() -> bool:
    """Podman run by a user other than root: its containers get no cgroup of their own where no
    systemd user manager delegates one, so `--cpuset-cpus` fails; conmon inherits our affinity."""
    return os.geteuid() != 0


