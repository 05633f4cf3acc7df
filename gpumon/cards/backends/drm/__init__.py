"""AMD and Intel cards through the kernel: sysfs for the cards, /proc/PID/fdinfo for their processes.

One small reader per kernel file, each returning a typed record: `sysfs` (finding the cards),
`hwmon`, `amdgpu`, `intel`, `fdinfo` (the clients), `names` (pci.ids), `topology` (PCIe paths,
xGMI); `backend` turns them into samples. Roots are options (`--path.sysfs`, `--path.procfs`), so the
same code reads a host's /sys and /proc mounted in a container, and the tests' fake trees.
"""

from gpumon.cards.backends.drm.backend import BACKEND, DrmBackend

__all__ = ["BACKEND", "DrmBackend"]
