"""The real driver, through nvidia-ml-py (the `pynvml` module): the only package that calls NVML.

Rules it keeps, because real drivers vary:
- A field a card answers NOT_SUPPORTED / NO_PERMISSION, or a function the driver lacks, is
  remembered and never asked again; it reads None.
- A card that answers GPU_IS_LOST is "lost" from then on; an unexpected error makes that sample
  "error". Other cards keep reporting.
- Newer functions fall back to older ones when the driver lacks them (process v3 -> v2 -> v1,
  memory info v2 -> v1, clock-event reasons -> throttle reasons).

library.py loads the library and reads one card's fields safely; backend.py samples the cards;
topology.py and events.py read links and XID events.
"""

from gpumon.cards.backends.nvml.backend import NvmlBackend
from gpumon.cards.backends.nvml.library import NO_DRIVER_HINT

BACKEND = NvmlBackend
__all__ = ["BACKEND", "NO_DRIVER_HINT", "NvmlBackend"]
