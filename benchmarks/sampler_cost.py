#!/usr/bin/env python3
"""CPU time of one sampler pass (NVML via the fake driver + psutil enrichment) by cards and processes;
and of AMD cards read from a fake sysfs, with their processes from a fake procfs's fdinfo.

Shows that the cost per sample grows about linearly with cards and processes. Run from the repo
root: `python benchmarks/sampler_cost.py`. Needs a C compiler (builds the test suite's fake driver).
Printed, not asserted: timings on shared machines are noisy.

The last rows are cards that report every health counter (row remaps, ECC, PCIe replays, memory
temperature, energy, 4 NVLinks, clock events, GPM): a sample between two counter reads, and a
sample that reads them (every 30 s per card by default), whose extra cost is spread over the
samples between.

Who holds the cards: what HolderTracker.update (gpumon users, the idle rule, the users view) adds
to a pass at 64 and 512 processes, as they come (one user) and spread over 64 Slurm jobs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fakenvml import GIB, Card, FakeMachine, build  # noqa: E402


def spawn_idle(count: int) -> list[subprocess.Popen]:
    return [subprocess.Popen(["sleep", "600"]) for _ in range(count)]


# Every health counter the fake driver serves (tests/fakenvml/fake_nvml.c).
HEALTH = dict(remap_cor=0, remap_unc=0, remap_pending=0, remap_failure=0, ecc_corrected=0, ecc_corrected_agg=0,
              ecc_uncorrected_agg=0, pcie_replay=0, mem_temp="40..60", mem_temp_max=95, energy_mj=1000,
              switch_links=4, nvlink_tx_kibs=1000, nvlink_rx_kibs=1000, nvlink_crc_flit=0, nvlink_crc_data=0,
              nvlink_replay=0, nvlink_recovery=0, clk_sw_power=1, clk_sync_boost=0, clk_sw_thermal=0,
              clk_hw_thermal=0, clk_hw_power_brake=0, gpm=1, gpm_gr=50, gpm_sm=40, gpm_occupancy=30,
              gpm_tensor=20, gpm_dram=10)


def measure(cards: int, procs: list[subprocess.Popen], passes: int, workdir: Path, lib: Path,
            health: bool = False, read_counters: bool = False) -> float:
    """CPU seconds a pass; `health`: every card reports every health counter; `read_counters`:
    each pass reads them (as one pass in every `[health] interval` does)."""
    from gpumon.cards.backends.nvml import NvmlBackend
    from gpumon.cards.sampler import Sampler
    from gpumon.health import rules as rules

    extra = dict(util="10..90", temp="40..80", power_mw="100000..300000", **(HEALTH if health else {}))
    machine = FakeMachine(
        cards=[Card(extra=extra) for _ in range(cards)],
        procs=[dict(gpu=i % cards, pid=p.pid, mem=GIB, sm="0..100") for i, p in enumerate(procs)],
    )
    config = workdir / f"bench-{cards}-{len(procs)}-{health}.conf"
    machine.write(config)
    os.environ["FAKE_NVML_CONFIG"] = str(config)
    backend = NvmlBackend(lib_path=str(lib))
    sampler = Sampler(backend)
    sampler.collect()  # warm the caches, as in a long-running monitor
    if read_counters:
        rules.configure({"interval": "0s"})
    try:
        start = time.process_time()
        for _ in range(passes):
            sampler.collect()
        cost = (time.process_time() - start) / passes
    finally:
        rules.configure({})
    backend.close()
    return cost


def sampled(cards: int, procs: list[subprocess.Popen], passes: int, workdir: Path, lib: Path,
            name: str) -> tuple[list, float]:
    """`passes` snapshots of the sampler over the fake driver (these processes on `cards` cards,
    moving values), and the CPU seconds a pass took."""
    from gpumon.cards.backends.nvml import NvmlBackend
    from gpumon.cards.sampler import Sampler

    machine = FakeMachine(cards=[Card(extra=dict(util="10..90", power_mw="100000..300000")) for _ in range(cards)],
                          procs=[dict(gpu=i % cards, pid=p.pid, mem=GIB, sm="0..100") for i, p in enumerate(procs)])
    config = workdir / f"{name}-{cards}-{len(procs)}.conf"
    machine.write(config)
    os.environ["FAKE_NVML_CONFIG"] = str(config)
    backend = NvmlBackend(lib_path=str(lib))
    sampler = Sampler(backend)
    sampler.collect()
    start = time.process_time()
    snapshots = [sampler.collect() for _ in range(passes)]
    pass_cost = (time.process_time() - start) / passes
    backend.close()
    return snapshots, pass_cost


def in_jobs(snapshot):
    """The snapshot with its processes spread over 64 Slurm jobs of 16 users."""
    import dataclasses

    from gpumon.model import ProcessOwner

    def owned(p):
        user = f"user{p.pid % 16}"
        return dataclasses.replace(p, user=user, owner=ProcessOwner("slurm", f"{1000 + p.pid % 64}.0", None, user))
    return dataclasses.replace(snapshot, gpus=tuple(dataclasses.replace(g, processes=tuple(map(owned, g.processes)))
                                                    for g in snapshot.gpus))


def measure_holders(cards: int, procs: list[subprocess.Popen], passes: int, workdir: Path,
                    lib: Path) -> tuple[float, float, float]:
    """CPU seconds a sampler pass, and what HolderTracker.update adds to it (who holds the cards:
    `gpumon users`, the `idle` rule, the users view): on the pass's snapshots as they are (these
    processes all belong to one user), and with them spread over 64 Slurm jobs of 16 users (more
    rows to add up). The owner lookup itself is in the pass: read once per process, kept."""
    from gpumon.owners.holders import HolderTracker

    snapshots, pass_cost = sampled(cards, procs, passes, workdir, lib, "holders")

    costs = []
    for shaped in (snapshots, [in_jobs(s) for s in snapshots]):
        tracker = HolderTracker()
        start = time.process_time()
        for snapshot in shaped:
            tracker.update(snapshot)
        costs.append((time.process_time() - start) / passes)
    return pass_cost, costs[0], costs[1]


def measure_drm(cards: int, procs: list[subprocess.Popen], others: int, passes: int, workdir: Path,
                rescan_s: float | None = None) -> tuple[float, int]:
    """AMD cards from a fake sysfs, their processes from a fake procfs: each GPU process (a real
    one) holds one DRM fd among 15 others, and `others` processes hold no DRM fd at all (the
    rest of a busy host, whose fd lists are looked at too). The clock moves 1 s a pass, so fd
    lists are read again as they would be (every RESCAN_S, staggered). Returns (CPU s per pass,
    fd lists read)."""
    from fakedrm import FakeKernel, amdgpu_fdinfo

    from gpumon.cards.backends.drm import DrmBackend
    from gpumon.cards.sampler import Sampler

    kernel = FakeKernel(workdir / f"drm-{cards}-{len(procs)}-{others}-{rescan_s}")
    addresses = [kernel.sys.amd(f"0000:{0x10 + i:02x}:00.0", parents=(f"pci0000:{0x10 + i:02x}",)).address
                 for i in range(cards)]
    for i, proc in enumerate(procs):
        kernel.proc.client(proc.pid, 30, amdgpu_fdinfo(addresses[i % cards], i, vram_kib=1 << 20,
                                                       gfx_ns=i * 1000))
        for fd in range(15):
            os.symlink(f"/tmp/file{fd}", kernel.proc.root / str(proc.pid) / "fd" / str(fd))
    for n in range(others):
        pid = 4_000_000 + n  # beyond any real pid: stands for the host's other processes
        kernel.proc.process(pid, real_pid=procs[n % len(procs)].pid if procs else os.getpid())
        for fd in range(15):
            os.symlink(f"/tmp/file{fd}", kernel.proc.root / str(pid) / "fd" / str(fd))
    clock = [0.0]
    backend = DrmBackend(sysfs=str(kernel.sys.root), procfs=str(kernel.proc.root), clock=lambda: clock[0])
    if rescan_s is not None:
        backend.clients.rescan_s = rescan_s
    sampler = Sampler(backend)
    sampler.collect()
    scans = backend.clients.fd_scans
    start = time.process_time()
    for _ in range(passes):
        clock[0] += 1.0
        sampler.collect()
    return (time.process_time() - start) / passes, backend.clients.fd_scans - scans


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gpumon-bench-"))
    lib = build(workdir)
    pool = spawn_idle(512)
    try:
        print(f"{'cards':>5} {'procs':>5} {'ms CPU/sample':>14} {'us per card+proc':>17}")
        for cards, nprocs in [(1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (8, 64), (8, 128), (8, 256), (8, 512)]:
            cost = measure(cards, pool[:nprocs], passes=20, workdir=workdir, lib=lib)
            print(f"{cards:>5} {nprocs:>5} {cost * 1000:>14.2f} {cost * 1e6 / (cards + nprocs):>17.0f}")
        print("\nWho holds the cards (HolderTracker.update) beside the sample pass, 8 cards:")
        print(f"{'procs':>5} {'pass ms':>8} {'holders ms':>11} {'+%':>6} {'in 64 jobs ms':>14} {'+%':>6}")
        for nprocs in (64, 512):
            pass_cost, one_user, jobs = measure_holders(8, pool[:nprocs], passes=20, workdir=workdir, lib=lib)
            print(f"{nprocs:>5} {pass_cost * 1000:>8.2f} {one_user * 1000:>11.2f} {one_user / pass_cost * 100:>6.1f} "
                  f"{jobs * 1000:>14.2f} {jobs / pass_cost * 100:>6.1f}")
        print("\nAMD cards (sysfs + fdinfo); each process 1 DRM fd among 16; 'other': processes with none")
        print(f"{'cards':>5} {'procs':>5} {'other':>5} {'fd lists':>12} {'ms CPU/sample':>14} {'fd lists read/s':>16}")
        for cards, nprocs, others, rescan in [(8, 0, 0, None), (8, 64, 0, None), (8, 256, 0, None),
                                              (8, 256, 512, None), (8, 256, 512, 0.0)]:
            cost, scans = measure_drm(cards, pool[:nprocs], others, passes=30, workdir=workdir, rescan_s=rescan)
            how = "every sample" if rescan == 0.0 else "cached"
            print(f"{cards:>5} {nprocs:>5} {others:>5} {how:>12} {cost * 1000:>14.2f} {scans / 30:>16.0f}")

        from gpumon.health.rules import DEFAULT_INTERVAL_S

        between = measure(8, [], passes=20, workdir=workdir, lib=lib, health=True)
        reading = measure(8, [], passes=20, workdir=workdir, lib=lib, health=True, read_counters=True)
        spread = between + (reading - between) / DEFAULT_INTERVAL_S
        print(f"8 cards, every health counter: {between * 1000:.2f} ms between counter reads, "
              f"{reading * 1000:.2f} ms in a pass that reads them; at 1 Hz (a read every "
              f"{DEFAULT_INTERVAL_S:g} s): {spread * 1000:.2f} ms a sample")
    finally:
        for p in pool:
            p.kill()


if __name__ == "__main__":
    main()
