"""The seams vendors and backends are added at: the backend registry, a composite of any number of
backends, the base class's defaults, and a vendor added through the vendor registry — with real
backends (the demo, the fake NVIDIA driver, fake kernel trees), not stand-ins."""

from __future__ import annotations

import dataclasses
import time

import pytest
from conftest import Card
from fakedrm import FakeSysfs

from gpumon.cards.backends import (
    Machine,
    backend_class,
    machine_backends,
    open_backend,
    register_backend,
    unregister_backend,
)
from gpumon.cards.backends.composite import CompositeBackend
from gpumon.cards.backends.demo import DemoBackend
from gpumon.cards.backends.drm import DrmBackend
from gpumon.cards.sampler import sample_once
from gpumon.errors import UsageError
from gpumon.jobs.pinning import named_cards, pin
from gpumon.jobs.placement import choose
from gpumon.vendors import Vendor, Visibility, register, unregister, vendor


def test_backends_are_found_by_name():
    assert backend_class("demo") is DemoBackend and backend_class("drm") is DrmBackend
    assert backend_class("nvml").__name__ == "NvmlBackend" and backend_class("replay").__name__ == "ReplayBackend"
    assert isinstance(open_backend(demo="default"), DemoBackend)
    assert machine_backends() == ["nvml", "drm"]  # the vendors' order: NVIDIA's cards are numbered first


def test_a_backend_without_an_ability_says_so_by_its_defaults():
    demo = DemoBackend()
    assert demo.identity(0.5) is None and demo.health_baseline() is None and not demo.xid_events
    assert demo.procfs is None and demo.index_count() == 0 and demo.pci_paths("/sys") == {}
    began = time.monotonic()
    assert demo.wait_xid(0.05) == [] and time.monotonic() - began >= 0.05  # waits as a listener expects
    assert len(demo.sample_within(0.1).gpus) == len(demo.specs)  # no deadline to take: a plain sample
    assert demo.topology_within(0.1).indices == tuple(range(len(demo.specs)))


def test_a_composite_of_three_backends(fake_driver, fake_kernel, tmp_path):
    fake_driver.machine.cards = [Card("NVIDIA A100-SXM4-80GB", bus="00000000:07:00.0"),
                                 Card("NVIDIA A100-SXM4-80GB", bus="00000000:0F:00.0")]
    fake_driver.write()
    fake_kernel.sys.amd("0000:43:00.0", parents=("pci0000:40",))
    other = FakeSysfs(tmp_path / "other-sys")  # a second tree: a third backend of its own
    other.intel("0000:83:00.0", driver="xe", parents=("pci0000:80",))
    nvml = backend_class("nvml").open_here(Machine(nvml_lib=str(fake_driver.lib)))
    amd = DrmBackend.open_here(Machine(sysfs=str(fake_kernel.sys.root), procfs=str(fake_kernel.proc.root)),
                               first_index=nvml.index_count())
    intel = DrmBackend.open_here(Machine(sysfs=str(other.root), procfs=str(fake_kernel.proc.root)),
                                 first_index=nvml.index_count() + amd.index_count())
    both = CompositeBackend([nvml, amd, intel], sysfs=str(fake_kernel.sys.root))
    try:
        assert both.name == "nvml" and both.xid_events and both.procfs == str(fake_kernel.proc.root)
        assert both.index_count() == 4
        snap = sample_once(both, wait_s=5)
        assert [(g.index, g.vendor) for g in snap.gpus] == [(0, "nvidia"), (1, "nvidia"), (2, "amd"), (3, "intel")]
        assert [g.index for g in both.identity(5).gpus] == [0, 1, 2, 3]
        topo = both.topology_within(5)
        assert topo.indices == (0, 1, 2, 3) and [row[i] for i, row in enumerate(topo.links)] == ["X"] * 4
        assert topo.links[2][3] == topo.links[3][2] == "NODE"  # different host bridges, NUMA unknown
        assert all(len(row) == 4 for row in (*topo.links, *topo.nvlinks)) and len(topo.nvswitch) == 4
        assert both.wait_xid(0.05) == []
    finally:
        both.close()


@pytest.fixture
def acme():
    """A vendor of the test's own, registered for the test only."""
    record = register(Vendor("acme", "Acme", "AcmeRT", "ART",
                             Visibility("ACME_VISIBLE_DEVICES", "number", also=(("ACME_DEVICE_ORDER", "PCI"),),
                                        unset=("CUDA_VISIBLE_DEVICES",)),
                             backend="", exporter="acme", article="an"))
    try:
        yield record
    finally:
        unregister("acme")


def test_a_vendor_added_through_the_registry_is_pinned_with_its_own_variables(acme):
    cards = sample_once(DemoBackend(scenario="default")).gpus
    theirs = [dataclasses.replace(g, vendor="acme", vendor_index=n, mig_mode=None) for n, g in enumerate(cards[:2])]
    pinned = pin(theirs, "job-1", numa=False)
    assert pinned.env == {"ACME_VISIBLE_DEVICES": "0,1", "ACME_DEVICE_ORDER": "PCI", "GPUMON_JOB_ID": "job-1"}
    assert pinned.unset == ("CUDA_VISIBLE_DEVICES",) and pinned.visible == "0,1" == named_cards(pinned.env)
    # auto chooses among the host's first vendor's cards, and says so in the vendor's own words
    mixed = dataclasses.replace(sample_once(DemoBackend(scenario="default")), gpus=(*cards[2:], *theirs))
    choice = choose(mixed, 1)
    assert choice.gpus[0].vendor == "nvidia"
    assert any("an Acme card; auto chooses among the NVIDIA cards" in r for r in choice.reasons), choice.reasons
    assert vendor("acme") is acme


class AcmeBackend(DemoBackend):
    """A new vendor's backend, as its own folder would hold it: the demo's cards, numbered after
    the backends opened before it, as Acme's."""

    name = "acme"

    def __init__(self, first_index: int) -> None:
        super().__init__(scenario="default")
        self.first_index = first_index

    @classmethod
    def open_here(cls, machine, first_index=0):
        return cls(first_index)

    def index_count(self) -> int:
        return len(self.specs)

    def sample(self):
        snap = super().sample()
        return dataclasses.replace(snap, gpus=tuple(
            dataclasses.replace(g, index=self.first_index + n, vendor="acme", vendor_index=n, mig_mode=None)
            for n, g in enumerate(snap.gpus)))


BACKEND = AcmeBackend  # what the backend registry looks for in a backend's module


def test_a_new_vendor_is_its_backend_and_one_record(acme, fake_kernel):
    """Registered, the vendor's backend opens beside the others on this machine (after them, as its
    record comes after theirs), and its cards are pinned with its variables."""
    register(dataclasses.replace(acme, backend="acme"))
    register_backend("acme", __name__)
    fake_kernel.sys.amd()
    backend = open_backend(nvml_lib=fake_kernel.no_nvidia, sysfs=str(fake_kernel.sys.root),
                           procfs=str(fake_kernel.proc.root))
    try:
        assert machine_backends() == ["nvml", "drm", "acme"] and isinstance(backend, CompositeBackend)
        gpus = sample_once(backend, wait_s=5).gpus
        assert [(g.index, g.vendor) for g in gpus] == [(0, "amd"), *((n, "acme") for n in range(1, 5))]
        assert pin(list(gpus[1:3]), "job-2").env["ACME_VISIBLE_DEVICES"] == "0,1"
    finally:
        backend.close()
        unregister_backend("acme")


def test_a_vendor_no_record_has_is_shown_by_its_name_and_never_pinned():
    card = dataclasses.replace(sample_once(DemoBackend(scenario="default")).gpus[0], vendor="zzz", vendor_index=0)
    assert vendor("zzz").words == "zzz" and vendor("zzz").visibility is None
    with pytest.raises(UsageError, match="GPU 0: gpumon does not know how to pin a job to an zzz card"):
        pin([card], "job-1")
