#!/usr/bin/env python3
"""What reading the shared place (claims, queue, reservations: gpumon/sharing) costs as another
user fills it: 0, 1,000, 10,000, 50,000 and 100,000 files of theirs, in two shapes:

- `names`: files named like claims, small and unheld: a listing and an lstat each, and at most 256
  of one user's opened (held ones would cost the same opens: a flock test each);
- `junk`: files of other names: a listing each, never opened.

Per size: one `host_sharing` read (what the TUI's thread, `serve` and `snapshot --stream` do every
2 s at most, and what a launch does once), and the read a launch makes (`cards_taken_now`, claims
and reservations). Files are owned by `nobody`, as another user's would be (run as root to chown;
otherwise they are this user's, which costs the same to read).

Run from the repo root: `python benchmarks/shared_place.py`. Printed, not asserted.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpumon.jobs.claims_and_queue import cards_taken_now  # noqa: E402
from gpumon.sharing.folder import SharingSettings  # noqa: E402
from gpumon.sharing.view import host_sharing  # noqa: E402

SIZES = (0, 1_000, 10_000, 50_000, 100_000)
NOBODY = 65534


def fill(place: Path, count: int, shape: str) -> None:
    for i in range(count):
        name = f"claim.GPU-{i}.job{i}.0000" if shape == "names" else f"junk-{i}"
        path = place / name
        path.write_bytes(b'{"card": "GPU-%d"}' % i)
        if os.geteuid() == 0:
            os.chown(path, NOBODY, NOBODY)


def best_of(runs: int, what) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        what()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    print(f"{'files':>8}  {'shape':<6}  {'host_sharing':>13}  {'a launch reads':>15}")
    for shape in ("names", "junk"):
        for count in SIZES:
            place = Path(tempfile.mkdtemp(prefix="gpumon-place-"))
            try:
                os.chmod(place, 0o1777)
                fill(place, count, shape)
                settings = SharingSettings(place)
                view = best_of(3, lambda: host_sharing(settings))
                launch = best_of(3, lambda: cards_taken_now(place))
                print(f"{count:>8}  {shape:<6}  {view * 1000:>10.1f} ms  {launch * 1000:>12.1f} ms")
            finally:
                shutil.rmtree(place, ignore_errors=True)


if __name__ == "__main__":
    main()
