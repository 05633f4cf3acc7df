"""Placement users can trust: busy cards are not free unless the user lowers the bar, links decide
among free cards, and --verbose says why in words."""

from __future__ import annotations

import json

from conftest import GIB, Card


def mixed_machine(machine) -> None:
    """Cards 0-2 share a PCIe switch: 0 idle, 1 hot and nearly full (7 GiB free), 2 at 85 %.
    Cards 3 and 4, idle with 79 GiB free, sit on the other socket."""
    idle = dict(util=0, temp=35, mem_used=GIB)
    machine.cards = [
        Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB, extra=dict(idle, cpus="0-15", numa=0)),
        Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB, extra=dict(util=3, temp=90, mem_used=73 * GIB)),
        Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB, extra=dict(util=85, temp=70, mem_used=2 * GIB)),
        Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB, extra=dict(idle, numa=1)),
        Card("NVIDIA H100 80GB HBM3", mem_total=80 * GIB, extra=dict(idle, numa=1)),
    ]
    machine.topo_default = 50  # SYS
    machine.links = [(0, 1, 10), (0, 2, 10), (1, 2, 10), (3, 4, 40)]


def uuids(fake_driver) -> dict[int, str]:
    snap = json.loads(fake_driver.run("snapshot", "--json").stdout)
    return {g["index"]: g["uuid"] for g in snap["gpus"]}


def test_busy_cards_are_not_free_even_with_better_links(fake_driver):
    mixed_machine(fake_driver.machine)
    fake_driver.write()
    uuid = uuids(fake_driver)
    out = fake_driver.run("select", "--count", "3", "--verbose")
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.strip().split(",")) == {uuid[0], uuid[3], uuid[4]}
    assert "GPU 1 skipped: busy: 73G of 80G in use (more than 10% = 8.0G; --max-used raises the bar)" in out.stderr
    assert "GPU 2 skipped: busy: 85% utilised (more than 10%; --max-util raises the bar)" in out.stderr
    assert "chose GPU 0, GPU 3, GPU 4" in out.stderr


def test_lowering_the_bar_lets_busy_cards_in_and_links_decide(fake_driver):
    mixed_machine(fake_driver.machine)
    fake_driver.write()
    uuid = uuids(fake_driver)
    out = fake_driver.run("select", "--count", "3", "--max-util", "100", "--max-used", "100%")
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.strip().split(",")) == {uuid[0], uuid[1], uuid[2]}  # one PCIe switch


def test_count_4_does_not_fill_up_with_a_nearly_full_small_card(fake_driver):
    m = fake_driver.machine
    m.cards = [Card("NVIDIA A100-SXM4-80GB", mem_total=80 * GIB, extra=dict(util=0, mem_used=GIB)) for _ in range(3)]
    m.cards.append(Card("NVIDIA GeForce RTX 4090", mem_total=24 * GIB, extra=dict(util=2, mem_used=22 * GIB)))
    m.cards.append(Card("NVIDIA A100-SXM4-80GB", mem_total=80 * GIB, extra=dict(util=0, mem_used=GIB)))
    m.links = [(a, b, 10) for a in range(4) for b in range(a + 1, 4)]  # 0-3 on one switch, 4 across
    fake_driver.write()
    uuid = uuids(fake_driver)
    out = fake_driver.run("select", "--count", "4", "--verbose")
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.strip().split(",")) == {uuid[0], uuid[1], uuid[2], uuid[4]}
    assert "GPU 3 skipped: busy: 22G of 24G in use" in out.stderr


def test_reasons_never_read_the_same_on_both_sides(fake_driver):
    # 69.96 GiB free against 70G needed: "70G free < 70G" is not a reason.
    fake_driver.machine.cards = [Card(mem_total=80 * GIB, extra=dict(util=0, mem_used=int(10.04 * GIB)))]
    fake_driver.write()
    out = fake_driver.run("select", "--min-free", "70G", "--max-used", "20%", "--verbose")
    assert out.returncode == 1
    assert "GPU 0 skipped: too full: 69.96G free, 70.00G needed (--min-free)" in out.stderr


def test_too_few_free_cards_says_why_each_was_passed_over(fake_driver):
    mixed_machine(fake_driver.machine)
    fake_driver.write()
    out = fake_driver.run("select", "--count", "4", "--verbose")
    assert out.returncode == 1 and out.stdout == ""
    assert "only 3 of 5 cards are free, 4 wanted" in out.stderr
    assert "GPU 1 skipped: busy" in out.stderr and "GPU 2 skipped: busy" in out.stderr


def test_run_auto_uses_the_same_bar(fake_driver, tmp_path):
    # The old rule, "most free memory first", would take card 2 (85 % busy, 78 GiB free).
    mixed_machine(fake_driver.machine)
    fake_driver.machine.cards[0].extra.update(util=50)
    fake_driver.machine.cards[3].extra.update(mem_used=40 * GIB)
    fake_driver.machine.cards[4].extra.update(mem_used=3 * GIB)
    fake_driver.write()
    uuid = uuids(fake_driver)
    probe = tmp_path / "env"
    out = fake_driver.run("run", "--gpu", "auto", "--foreground", "--", "sh", "-c",
                          f"echo $CUDA_VISIBLE_DEVICES > {probe}")
    assert out.returncode == 0, out.stderr
    assert probe.read_text().strip() == uuid[4]
