"""Reading the cards: backends (the NVML driver, the demo, a recording), the sampler that calls
them off the event loop and publishes Snapshots, and what the OS adds about processes.

Only monitor/backends/nvml.py touches NVML. Nothing here imports Textual.
"""
