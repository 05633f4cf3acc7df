"""Reading a host without gpumon on it: `nvidia-smi`'s CSV queries, over the same ssh connection.

The fields are nvidia-smi's documented query names (`nvidia-smi --help-query-gpu`,
`--help-query-compute-apps`), chosen from those every driver of the last decade knows: asking for
one it does not know fails the whole query. Columns are found by the header (`memory.used [MiB]`:
nvidia-smi keeps the unit in the header under `nounits`), so their order does not matter; values
nvidia-smi cannot give (`[N/A]`, `[Not Supported]`, `N/A`, …) become None, never 0.
"""

from __future__ import annotations

import csv
import io
import time

from gpumon.fleet.schema import MAX_CARDS, MAX_PROCESSES, SchemaError
from gpumon.model import GpuSample, ProcessSample, Snapshot
from gpumon.sanitize import printable

MIB = 1 << 20
GPU_FIELDS = ("index", "uuid", "name", "pci.bus_id", "driver_version", "utilization.gpu", "utilization.memory",
              "memory.total", "memory.used", "memory.free", "temperature.gpu", "fan.speed", "power.draw",
              "power.limit", "clocks.current.sm", "clocks.current.memory", "pstate")
APP_FIELDS = ("gpu_uuid", "pid", "process_name", "used_gpu_memory")
# Other names nvidia-smi accepts for the same fields (the header says the name it was asked).
ALIASES = {"gpu_uuid": "uuid", "gpu_name": "name", "clocks.sm": "clocks.current.sm",
           "clocks.mem": "clocks.current.memory", "used_memory": "used_gpu_memory"}
SEPARATOR = "--- compute apps ---"
NOTE = "read through nvidia-smi; launching needs gpumon installed there"


def remote_command() -> str:
    """One shell line for the remote host: both queries, with a separator between them."""
    return (f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,nounits"
            f" && echo '{SEPARATOR}'"
            f" && nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,nounits")


def _missing(value: str) -> bool:
    v = value.strip().strip("[]").lower()
    return v in ("", "n/a", "not supported", "unknown error", "insufficient permissions", "gpu is lost",
                 "requested functionality has been deprecated", "no data")


def _rows(text: str) -> list[dict[str, str]]:
    """CSV with a header -> dicts keyed by field name (units and spaces stripped)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return []
    reader = csv.reader(io.StringIO("\n".join(lines)), skipinitialspace=True)
    header = [h.split(" [", 1)[0].strip() for h in next(reader)]
    header = [ALIASES.get(h, h) for h in header]
    return [dict(zip(header, (cell.strip() for cell in row))) for row in reader]


def _get(row: dict[str, str], name: str) -> str | None:
    value = row.get(name)
    return None if value is None or _missing(value) else value


def _int(row: dict[str, str], name: str, scale: int = 1) -> int | None:
    value = _get(row, name)
    try:
        return None if value is None else int(float(value) * scale)
    except ValueError:
        return None


def _float(row: dict[str, str], name: str) -> float | None:
    value = _get(row, name)
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def _text(row: dict[str, str], name: str, limit: int = 128) -> str | None:
    value = _get(row, name)
    return None if value is None else printable(value[:limit])


def parse(output: str, host: str, now: float | None = None) -> Snapshot:
    """The two queries' output (see remote_command) -> Snapshot; SchemaError if it is not that."""
    gpu_text, found, app_text = output.partition(SEPARATOR)
    if not found:
        raise SchemaError("nvidia-smi output without the compute-apps part")
    cards = _rows(gpu_text)
    if len(cards) > MAX_CARDS:
        raise SchemaError(f"nvidia-smi listed {len(cards)} cards (at most {MAX_CARDS})")
    if cards and "uuid" not in cards[0]:
        raise SchemaError("nvidia-smi output has no uuid column")
    apps = _rows(app_text)[:MAX_PROCESSES]
    processes: dict[str, list[ProcessSample]] = {}
    for app in apps:
        pid = _int(app, "pid")
        if pid is None or pid <= 0:
            continue
        processes.setdefault(app.get("uuid", ""), []).append(ProcessSample(
            pid=pid, type="compute", gpu_memory=_int(app, "used_gpu_memory", MIB),
            command=_text(app, "process_name", 4096)))
    gpus = []
    for position, row in enumerate(cards):
        uuid = _text(row, "uuid")
        index = _int(row, "index")
        gpus.append(GpuSample(
            index=index if index is not None else position, uuid=uuid, name=_text(row, "name") or "?",  # type: ignore[arg-type]
            pci_bus_id=_text(row, "pci.bus_id", 64), state="ok",  # type: ignore[arg-type]
            utilization_gpu=_int(row, "utilization.gpu"), utilization_memory=_int(row, "utilization.memory"),
            memory_total=_int(row, "memory.total", MIB), memory_used=_int(row, "memory.used", MIB),
            memory_free=_int(row, "memory.free", MIB), temperature=_int(row, "temperature.gpu"),
            fan=_int(row, "fan.speed"), power_draw=_float(row, "power.draw"), power_limit=_float(row, "power.limit"),
            clock_sm=_int(row, "clocks.current.sm"), clock_mem=_int(row, "clocks.current.memory"),
            pstate=_text(row, "pstate", 8), processes=tuple(processes.get(uuid or "", ())),
        ))
    driver = _text(cards[0], "driver_version", 64) if cards else None
    return Snapshot(time=now or time.time(), host=host, backend="nvml", driver_version=driver,
                    cuda_driver_version=None, gpus=tuple(gpus))
