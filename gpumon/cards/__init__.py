"""Reading this machine's cards: the backends (the NVML driver, AMD and Intel through the kernel,
the demo, a recording), the sampler that calls them off the event loop and publishes Snapshots,
and what the OS adds about each card's processes. Only `backends/nvml/` touches NVML; nothing
here imports Textual.
"""
