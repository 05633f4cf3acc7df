"""Text that reaches the screen: invisible characters that reorder or hide text are shown as
escapes, names wider than their column are cut with `…`, and widths are terminal cells."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import GIB, Card
from rich.cells import cell_len
from rich.text import Text
from test_jobs import job_json, run_job, wait_for

from gpumon.cards.backends.demo import DemoBackend
from gpumon.model import GpuSample
from gpumon.sanitize import printable
from gpumon.tui.app import create_app
from gpumon.tui.widgets.card_list import CardList
from gpumon.tui.widgets.changed_cells import changed_span

INVISIBLE = [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), *range(0x200B, 0x2010))]
LONG_NAME = "NVIDIA H100 80GB HBM3 Special Edition for Very Long Names That Go On And On Beyond Ninety X"
CJK_NAME = "NVIDIA 测试卡 A100 🚀"


@pytest.mark.parametrize("char", INVISIBLE, ids=[f"U+{ord(c):04X}" for c in INVISIBLE])
def test_bidi_and_zero_width_characters_are_shown_as_escapes(char):
    shown = printable(f"python train.py{char}--lr 3")
    assert char not in shown and f"\\u{ord(char):04x}" in shown


def test_a_disguised_command_line_is_visible_as_such(fake_driver, idle_processes):
    # Displayed raw, U+202E would draw "...#yp.niart" backwards and hide what really runs.
    trick = "\u202ecod.niart\u2066 # \u2069x\u200b"
    proc = idle_processes(sys.executable, "-c", "import time; time.sleep(600)", trick)
    fake_driver.machine.cards = [Card("NVIDIA A10")]
    fake_driver.machine.procs = [dict(gpu=0, pid=proc.pid, mem=GIB)]
    fake_driver.write()
    for args in (("snapshot",), ("snapshot", "--json")):
        out = fake_driver.run(*args).stdout
        assert not any(c in out for c in INVISIBLE)
        assert "\\u202ecod.niart\\u2066 # \\u2069x\\u200b" in (json.loads(out)["gpus"][0]["processes"][0]["command"]
                                                              if "--json" in args else out)


def names_and_bus(fake_driver, name: str) -> None:
    fake_driver.machine.cards = [Card(name, bus="00000000:17:00.0", extra=dict(numa=1)), Card("NVIDIA A10")]
    fake_driver.write()


def test_a_long_card_name_does_not_widen_the_snapshot_table(fake_driver):
    names_and_bus(fake_driver, LONG_NAME)
    table = fake_driver.run("snapshot").stdout
    row = next(line for line in table.splitlines() if line.lstrip().startswith("0 "))
    assert "00000000:17:00.0" in row and "…" in row
    assert LONG_NAME[:20] in row and LONG_NAME not in row
    assert cell_len(row) < 150, row


def test_cjk_and_emoji_names_keep_the_snapshot_columns_aligned(fake_driver):
    names_and_bus(fake_driver, CJK_NAME)
    lines = fake_driver.run("snapshot").stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("GPU") and "NAME" in line)
    rows = lines[header:header + 3]
    # STATE starts in the same terminal column on every row.
    columns = {cell_len(row[:row.index(word)]) for row, word in zip(rows, ("STATE", "OK", "OK"))}
    assert len(columns) == 1, rows


def test_jobs_table_cuts_long_and_wide_names_by_cells(fake_driver):
    fake_driver.machine.cards = [Card("NVIDIA A10")]
    fake_driver.write()
    run_job(fake_driver, "--gpu", "0", "--name", "训练任务一号" * 4, "--", "true")
    run_job(fake_driver, "--gpu", "0", "--name", "plain", "--", "true")
    wait_for(lambda: all(j["state"] == "exited" for j in job_json(fake_driver)), what="the jobs to end")
    lines = fake_driver.run("jobs").stdout.splitlines()
    starts = {cell_len(line[:line.index("exited" if i else "STATE")]) for i, line in enumerate(lines)}
    assert len(starts) == 1, lines
    assert "…" in lines[1]


def panel_title(name: str, width: int) -> str:
    async def go():
        backend = DemoBackend()
        app = create_app(backend, interval=0.1)
        async with app.run_test(size=(width, 60)) as pilot:
            while app.sampler.latest is None:
                await pilot.pause(0.05)
            await pilot.pause(0.3)
            panel = app.main_screen.query_one(CardList).panels[0]
            gpu = GpuSample(index=0, uuid="GPU-0123456789ab-cdef", name=name, pci_bus_id="00000000:17:00.0",
                            numa_node=1)
            return panel._title(gpu, panel.content_region.width).plain, panel.content_region.width

    import asyncio

    title, room = asyncio.run(go())
    assert cell_len(title) <= room, (title, room)
    return title


@pytest.mark.parametrize("width", [120, 200])
def test_a_long_card_name_leaves_the_identifiers_on_the_card_line(width):
    title = panel_title(LONG_NAME, width)
    for needle in ("GPU-01234567", "17:00.0", "NUMA 1"):
        assert needle in title, title
    assert "…" in title


def test_a_wide_card_name_is_measured_in_cells():
    title = panel_title(CJK_NAME, 120)
    assert "测试卡" in title and title.endswith("NUMA 1")


def test_repaint_spans_are_cells_after_a_wide_name():
    before, after = Text("0 测试卡 util 40%"), Text("0 测试卡 util 47%")
    assert changed_span(before, after) == (15, 16)  # "测试卡" is three characters but six cells
