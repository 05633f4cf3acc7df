#!/usr/bin/env python3
"""The floor: what any Python monitor pays each second for NVML plus psutil on every process,
with no UI at all. benchmarks/bench.py runs it next to gpumon watch."""

import time

import psutil
import pynvml

pynvml.nvmlInit()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
while True:
    for h in handles:
        pynvml.nvmlDeviceGetUtilizationRates(h)
        pynvml.nvmlDeviceGetMemoryInfo(h)
        pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        pynvml.nvmlDeviceGetPowerUsage(h)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            try:
                proc = psutil.Process(p.pid)
                with proc.oneshot():
                    proc.username(), proc.cmdline(), proc.cpu_percent(), proc.memory_info()
            except psutil.Error:
                pass
    time.sleep(1.0)
