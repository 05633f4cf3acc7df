"""A stand-in for PyTorch in tests: just the torch.cuda surface gpumon's import hook uses."""
from . import cuda  # noqa: F401
