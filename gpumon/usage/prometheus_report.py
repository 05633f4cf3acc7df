"""`gpumon report --prometheus-url URL`: the same report from a Prometheus that scrapes gpumon
(`watch --prometheus`, with `--prometheus-processes` for users) or dcgm-exporter, for clusters that
keep their history there.

What Prometheus knows is coarser than the ledger, and the report says so by its `source`:
- users come from gpumon's per-process series (`gpumon_process_gpu_memory_bytes{user}`): a user
  holds a card while a process of theirs is listed on it; dcgm-exporter names no users.
- jobs, pods and containers come from the labels of a card's series (`hpc_job`, `pod` with
  `namespace`, `container`), which both exporters set while one holder has the whole card.
- SM %, energy and idle time are the card's (its utilisation, its power, utilisation 0) while the
  holder holds it: no per-process SM is exported.
Each figure is a subquery sampled every R seconds (R: the span / 1000, 1 s to 60 s), asked with
range queries (`/api/v1/query_range`) at once in threads; days are one step a day.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpumon.errors import UsageError
from gpumon.fleet.prometheus.api import ApiError, query_range
from gpumon.fleet.prometheus.login import login
from gpumon.sanitize import printable
from gpumon.usage.report import document

CARD = "Hostname, hostname, instance, UUID"
HOLDERS = {
    "user": ("count by (" + CARD + ", gpu, user) (gpumon_process_gpu_memory_bytes)",
             "sum by (" + CARD + ", gpu, user) (gpumon_process_gpu_memory_bytes)"),
    "job": ("max by (" + CARD + ", gpu, hpc_job, pod, namespace, container) (DCGM_FI_DEV_FB_USED{hpc_job!=\"\"} "
            "or DCGM_FI_DEV_FB_USED{pod!=\"\"} or DCGM_FI_DEV_FB_USED{container!=\"\"}) * 1048576",
            None),
}


def _resolution(span: float) -> int:
    return int(min(60, max(1, span // 1000)))


def _figures(held: str, memory: str, window: str) -> dict[str, str]:
    """PromQL per figure of the holders `held` (one series per card per holder)."""
    one = f"(({held}) * 0 + 1)"
    util = f"max by ({CARD}) (DCGM_FI_DEV_GPU_UTIL)"
    power = f"max by ({CARD}) (DCGM_FI_DEV_POWER_USAGE)"
    return {"held": f"count_over_time({one}{window})",
            "util": f"sum_over_time(({one} * on ({CARD}) group_left {util}){window})",
            "energy": f"sum_over_time(({one} * on ({CARD}) group_left {power}){window})",
            "idle": f"count_over_time(({one} and on ({CARD}) ({util} == 0)){window})",
            "peak": f"max_over_time(({memory}){window})",
            "last": f"max_over_time(timestamp({one}){window})"}


def _host(labels: dict[str, Any]) -> str:
    return printable(str(labels.get("Hostname") or labels.get("hostname") or labels.get("instance") or "?"))


def _holder(labels: dict[str, Any], by: str) -> tuple[str, str, str, str | None]:
    """(kind, id, label, user) of a series' holder."""
    if by == "user":
        user = printable(str(labels.get("user") or "?"))
        return "user", user, user, user
    if labels.get("pod"):
        ident = f"{labels.get('namespace', '')}/{labels['pod']}"
        name = ident + (f" ({labels['container']})" if labels.get("container") else "")
        return "k8s", printable(ident), printable(name), None
    if labels.get("hpc_job"):
        return "slurm", printable(str(labels["hpc_job"])), printable(f"job {labels['hpc_job']}"), None
    container = printable(str(labels.get("container", "")))
    return "container", container, container, None


def prometheus_report(url: str, start: float, end: float, by: str, price: float | None,
                      user: str | None = None, password_file: str | None = None) -> dict[str, Any]:
    server = login(url, user, password_file)
    span = max(1.0, end - start)
    r = _resolution(span)
    window = f"[{int(math.ceil(span))}s:{r}s]"
    asks: dict[tuple[str, str], str] = {}
    for kind in ("user", "job"):
        held, memory = HOLDERS[kind]
        for name, promql in _figures(held, memory or held, window).items():
            asks[kind, name] = promql
    cards = f"max by ({CARD}, gpu, modelName) "
    asks["card", "util"] = f"avg_over_time(({cards}(DCGM_FI_DEV_GPU_UTIL)){window})"
    asks["card", "energy"] = f"sum_over_time(({cards}(DCGM_FI_DEV_POWER_USAGE)){window})"
    asks["card", "watched"] = f"count_over_time(({cards}(DCGM_FI_DEV_GPU_UTIL)){window})"
    asks["card", "busy"] = f"max_over_time(timestamp({cards}(DCGM_FI_DEV_GPU_UTIL) > 0){window})"
    day = min(86400.0, span)
    days_q = f"avg_over_time(({cards}(DCGM_FI_DEV_GPU_UTIL))[{int(day)}s:{_resolution(day)}s])"

    def ask(item):
        key, promql = item
        return key, query_range(server, promql, end, end, 60.0)

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            answers = dict(pool.map(ask, asks.items()))
            daily = pool.submit(query_range, server, days_q, start + day, end, day).result()
    except ApiError as exc:
        raise UsageError(f"--prometheus-url {server.url}: {exc}") from None
    rows = _rows(answers, by, r, price)
    return document(start, end, by, "prometheus", price, rows, _cards(answers, r, price, rows), _days(daily))


def _value(series: list[tuple[float, float]]) -> float:
    return series[-1][1] if series else 0.0


def _rows(answers: dict, by: str, r: int, price: float | None) -> list[dict[str, Any]]:
    kinds = ("user", "job") if by == "user" else ("job",)
    rows: dict[tuple, dict[str, Any]] = {}
    for kind in kinds:
        for name in ("held", "util", "energy", "idle", "peak", "last"):
            for labels, points in answers[kind, name]:
                holder = _holder(labels, kind)
                host = _host(labels)
                key = (host, *holder[:2])
                row = rows.setdefault(key, {"host": host, "kind": holder[0], "id": holder[1], "label": holder[2],
                                            "user": holder[3], "held": 0.0, "util": 0.0, "energy": 0.0, "idle": 0.0,
                                            "peak": None, "last": None, "cards": set()})
                value = _value(points)
                row["cards"].add(str(labels.get("UUID") or labels.get("gpu")))
                if name in ("peak", "last"):
                    row[name] = value if row[name] is None else max(row[name], value)
                else:
                    row[name] += value
    out = []
    for row in rows.values():
        held_s = row["held"] * r
        kwh = row["energy"] * r / 3.6e6
        out.append({"host": row["host"], "kind": row["kind"], "id": row["id"], "label": row["label"],
                    "user": row["user"], "gpu_hours": round(held_s / 3600, 6), "energy_kwh": round(kwh, 6),
                    "cost": None if price is None else round(kwh * price, 6),
                    "mean_sm": round(row["util"] / row["held"], 1) if row["held"] else None,
                    "idle_hours": round(row["idle"] * r / 3600, 6),
                    "peak_memory": int(row["peak"]) if row["peak"] is not None else None, "mean_memory": None,
                    "cards": len(row["cards"]), "first": None, "last": row["last"]})
    if by == "job":
        return sorted(out, key=lambda x: (-x["gpu_hours"], x["host"], x["id"]))
    users = sorted((x for x in out if x["kind"] == "user"), key=lambda x: (-x["gpu_hours"], x["host"], x["id"]))
    jobs = sorted((x for x in out if x["kind"] != "user"), key=lambda x: (-x["gpu_hours"], x["host"], x["id"]))
    return users + jobs


def _cards(answers: dict, r: int, price: float | None, rows: list) -> list[dict[str, Any]]:
    cards: dict[tuple[str, str], dict[str, Any]] = {}
    for name in ("util", "energy", "watched", "busy"):
        for labels, points in answers["card", name]:
            key = (_host(labels), str(labels.get("UUID") or labels.get("gpu")))
            card = cards.setdefault(key, {"host": key[0], "card": key[1], "index": _index(labels.get("gpu")),
                                          "name": printable(str(labels.get("modelName") or "")), "last_used": None,
                                          "last_busy": None, "watched_hours": 0.0, "held_hours": None,
                                          "mean_util": None, "energy_kwh": 0.0, "cost": None})
            value = _value(points)
            if name == "util":
                card["mean_util"] = round(value, 1)
            elif name == "energy":
                card["energy_kwh"] = round(value * r / 3.6e6, 6)
                card["cost"] = None if price is None else round(card["energy_kwh"] * price, 6)
            elif name == "watched":
                card["watched_hours"] = round(value * r / 3600, 6)
            else:
                card["last_busy"] = value
    for card in cards.values():  # Prometheus: the last time it was busy (whoever held it)
        card["last_used"] = card["last_busy"]
    return sorted(cards.values(), key=lambda c: (c["host"], c["index"] if c["index"] is not None else -1))


def _index(text: Any) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _days(daily: list) -> list[dict[str, Any]]:
    out = []
    for labels, points in daily:
        for at, value in points:
            out.append({"day": time.strftime("%Y-%m-%d", time.localtime(at - 1)), "host": _host(labels),
                        "card": str(labels.get("UUID") or labels.get("gpu")), "index": _index(labels.get("gpu")),
                        "mean_util": round(value, 1)})
    return sorted(out, key=lambda d: (d["day"], d["host"], d["index"] if d["index"] is not None else -1))
