"""Put on a gpumon job's PYTHONPATH: caps PyTorch's CUDA caching allocator to the job's share
of the card, without importing torch or touching CUDA in processes that do not.

When `torch` is imported, a callable is queued with torch.cuda._lazy_call; it runs when (and if)
the process initialises CUDA, and sets set_per_process_memory_fraction on every visible device.
Any sitecustomize this one shadows is still run.
"""

import importlib.abc
import importlib.util
import os
import sys

_FRACTION = os.environ.get("GPUMON_TORCH_MEMORY_FRACTION")


def _apply(torch):
    fraction = float(_FRACTION)

    def cap():
        for device in range(torch.cuda.device_count()):
            torch.cuda.set_per_process_memory_fraction(fraction, device)

    torch.cuda._lazy_call(cap)


class _TorchWatcher(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_cap(module):
            exec_module(module)
            try:
                _apply(module)
            except Exception as exc:  # never break the user's program
                print(f"gpumon: could not cap PyTorch GPU memory: {exc}", file=sys.stderr)

        spec.loader.exec_module = exec_and_cap
        return spec


if _FRACTION:
    sys.meta_path.insert(0, _TorchWatcher())

# Run the sitecustomize this file shadows, if any.
_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    if os.path.abspath(_entry or ".") == _here:
        continue
    _candidate = os.path.join(_entry or ".", "sitecustomize.py")
    if os.path.isfile(_candidate):
        with open(_candidate) as _f:
            exec(compile(_f.read(), _candidate, "exec"), {"__name__": "sitecustomize", "__file__": _candidate})
        break
