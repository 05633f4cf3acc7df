"""gpumon: a terminal GPU monitor and launcher for NVIDIA machines."""

__version__ = "0.1.0"
