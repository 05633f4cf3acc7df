"""GPU Performance Monitoring (Hopper and later): SM activity and occupancy, tensor-core activity,
DRAM bandwidth, as percentages between two GPM samples taken a counter read apart.

Asked once per card whether it has GPM (`nvmlGpmQueryDeviceSupport`); a card without it (Ampere
and older, or a driver before GPM) is never asked again and reports none: null, not 0. Its two
samples and the metrics request are allocated once and reused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pynvml

from gpumon.cards.backends.nvml.library import Card

# Counter name -> GPM metric.
METRICS: dict[str, int] = {
    "gr_engine_active": pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL,
    "sm_active": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram_active": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}


@dataclass
class _State:
    previous: Any  # the last sample taken (None before the first)
    spare: Any  # where the next one goes
    request: Any  # c_nvmlGpmMetricsGet_t, filled in once


def metrics(card: Card) -> dict[str, float]:
    """The card's GPM metrics since the last call ({} on the first call and without GPM)."""
    state = card.gpm if card.gpm is not None else _start(card)
    if state is None:
        return {}
    taken = card.read("gpm", pynvml.nvmlGpmSampleGet, state.spare)
    if taken is None:
        return {}
    previous, state.previous, state.spare = state.previous, state.spare, state.previous or _alloc(card)
    if previous is None:
        return {}
    request = state.request
    request.sample1, request.sample2 = previous, state.previous
    if card.read("gpm", lambda _handle: pynvml.nvmlGpmMetricsGet(request)) is None:
        return {}
    out = {}
    for i, name in enumerate(METRICS):
        metric = request.metrics[i]
        if metric.nvmlReturn == pynvml.NVML_SUCCESS:
            out[name] = round(float(metric.value), 1)
    return out


def _start(card: Card) -> _State | None:
    if "gpm" in card.skip:
        return None
    support = card.read("gpm", pynvml.nvmlGpmQueryDeviceSupport)
    if support is None or not support.isSupportedDevice:
        card.skip.add("gpm")
        return None
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(METRICS)
    for i, metric in enumerate(METRICS.values()):
        request.metrics[i].metricId = metric
    spare = _alloc(card)
    if spare is None:
        return None
    card.gpm = _State(None, spare, request)
    return card.gpm


def _alloc(card: Card) -> Any:
    return card.read("gpm", lambda _handle: pynvml.nvmlGpmSampleAlloc())
