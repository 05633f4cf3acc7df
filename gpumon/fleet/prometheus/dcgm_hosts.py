"""Which host a dcgm-exporter series (or gpumon's) belongs to, as a Prometheus server holds it:
the `Hostname` label (dcgm-exporter 3.x and gpumon's exporter) or `hostname` (newer
dcgm-exporter), else the `exported_` form of either, else the scrape target's `instance`; and
when two machines report one name, which of them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpumon.fleet.prometheus.api import Series
from gpumon.sanitize import printable

HOST_LABELS = ("Hostname", "hostname", "exported_Hostname", "exported_hostname")
MAX_TEXT = 256


def text(labels: Mapping[str, Any], key: str, limit: int = MAX_TEXT) -> str | None:
    value = labels.get(key)
    if not isinstance(value, str) or not value:
        return None
    return printable(value[:limit])


def host_of(labels: Mapping[str, Any]) -> str | None:
    for key in (*HOST_LABELS, "instance"):
        name = text(labels, key)
        if name is not None:
            return name
    return None


def _machines(cards_by_target: Mapping[Any, set[Any]]) -> list[list[Any]]:
    """The scrape targets of one host name, grouped by the cards they share: a UUID names one
    card in the world, so targets that share one read the same machine."""
    groups: list[tuple[set[Any], list[Any]]] = []
    for target, uuids in cards_by_target.items():
        joined = [g for g in groups if g[0] & uuids]
        groups = [g for g in groups if not g[0] & uuids]
        groups.append((uuids.union(*(g[0] for g in joined)), [target, *(t for g in joined for t in g[1])]))
    return [targets for _, targets in groups]


def host_names(cards: Iterable[Series], split: Iterable[str] = ()) -> tuple[dict[tuple[str | None, Any], str],
                                                                            set[str]]:
    """(host name, scrape target's instance) -> the host it is shown as, and the names shown split.
    Two machines can report one name: a container image copied to two nodes keeps the Hostname it
    was built with, two exporters on one node each read their own cards. Merged, the cards of one
    would hide the other's of the same index; so each machine is a host of its own, "name
    (instance)". Targets that share cards (one node scraped under two names) stay one host. A
    name once split (`split`) stays split: when one machine stops, the other keeps its name."""
    seen: dict[str, dict[Any, set[Any]]] = {}
    for labels, _ in cards:
        name = host_of(labels)
        if name is not None:
            uuids = seen.setdefault(name, {}).setdefault(labels.get("instance"), set())
            if isinstance(uuid := labels.get("UUID"), str) and uuid:
                uuids.add(uuid)
    out: dict[tuple[str | None, Any], str] = {}
    split_now: set[str] = set()
    for name, by_target in seen.items():
        machines = _machines(by_target) if len(by_target) > 1 else [list(by_target)]
        if len(machines) == 1 and name not in split:
            out.update(((name, target), name) for target in by_target)
            continue
        split_now.add(name)
        for targets in machines:
            shown = min(printable(t[:MAX_TEXT]) if isinstance(t, str) and t else "?" for t in targets)
            out.update(((name, target), name if shown == name else f"{name} ({shown})") for target in targets)
    return out, split_now
