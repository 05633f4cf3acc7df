"""`h`: the selected card's health: its verdict with each reason and what fixes it, then every
health counter with what it means (null ones say the card or driver does not report them)."""

from __future__ import annotations

from collections.abc import Callable

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpumon.counters import CLOCK_EVENT_TIMES, CardCounters
from gpumon.model import GpuSample
from gpumon.units import format_bytes

NA = "N/A"
VERDICT_STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red"}


def _count(value: int | None) -> str:
    return NA if value is None else f"{value:,}"


def _flag(value: bool | None) -> str:
    return NA if value is None else "yes" if value else "no"


def _pct(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def _celsius(value: int | None) -> str:
    return NA if value is None else f"{value} °C"


def _rate(value: int | None) -> str:
    return NA if value is None else f"{format_bytes(value)}/s"


def _energy(c: CardCounters) -> str:
    if c.energy_j is None:
        return NA
    since = "since the driver loaded" if c.energy_source == "driver" else "integrated since gpumon started"
    return f"{c.energy_j / 3.6e6:.3f} kWh ({since})"


def _replays(c: CardCounters) -> str:
    if c.pcie_replay_counter is None:
        return NA
    rate = "" if c.pcie_replay_rate is None else f" ({c.pcie_replay_rate * 60:.1f} a minute lately)"
    return f"{c.pcie_replay_counter:,}{rate}"


def _clocks(c: CardCounters) -> str:
    if c.clock_event_s is None:
        return NA
    return ", ".join(f"{name} {s:,.0f} s" for name, s in zip(CLOCK_EVENT_TIMES, c.clock_event_s, strict=True)
                     if s is not None) or NA


# (label, value in words, what it means)
COUNTERS: list[tuple[str, Callable[[CardCounters], str], str]] = [
    ("Row remaps, correctable", lambda c: _count(c.remapped_rows_correctable),
     "rows of memory swapped for spares after correctable errors (Ampere and later); climbing: keep watching"),
    ("Row remaps, uncorrectable", lambda c: _count(c.remapped_rows_uncorrectable),
     "rows swapped for spares after uncorrectable errors"),
    ("Row remap pending", lambda c: _flag(c.remapped_rows_pending),
     "a remap waits for a reset of the card: until then the bad row is in use"),
    ("Row remap failed", lambda c: _flag(c.remapped_rows_failure),
     "a bank ran out of spare rows: the card needs service"),
    ("Retired pages, single-bit", lambda c: _count(c.retired_pages_sbe),
     "pages taken out of use after repeated correctable errors (cards before Ampere)"),
    ("Retired pages, double-bit", lambda c: _count(c.retired_pages_dbe),
     "pages taken out of use after an uncorrectable error"),
    ("Retirement pending", lambda c: _flag(c.retired_pages_pending), "pages wait for a reset to be retired"),
    ("Retired pages", lambda c: _count(c.retired_pages_reserved),
     "bad pages taken out of use, cause not told (AMD: amdgpu's bad pages, kept on the board)"),
    ("Retirement failed", lambda c: _count(c.retired_pages_failed),
     "bad pages the driver could not take out of use (AMD)"),
    ("ECC corrected", lambda c: _count(c.ecc_errors_corrected),
     "single-bit errors corrected since the driver loaded (AMD: every RAS block's)"),
    ("ECC corrected, lifetime", lambda c: _count(c.ecc_errors_corrected_aggregate), "the same over the card's life"),
    ("ECC uncorrected, lifetime", lambda c: _count(c.ecc_errors_uncorrected_aggregate),
     "double-bit errors over the card's life (since the driver loaded: the panel's ECC)"),
    ("PCIe replays", _replays, "packets the PCIe link sent again; climbing: a bad slot, riser or seating"),
    ("Memory temperature", lambda c: _celsius(c.memory_temperature), "the HBM's own sensor"),
    ("Memory max temperature", lambda c: _celsius(c.memory_temperature_max), "the most the memory is made to run at"),
    ("Energy", _energy, "what the card has drawn"),
    ("NVLink traffic", lambda c: NA if c.nvlink_tx is None and c.nvlink_rx is None
     else f"▲{_rate(c.nvlink_tx)} ▼{_rate(c.nvlink_rx)}", "data sent and received over all its NVLinks"),
    ("NVLink CRC errors", lambda c: NA if c.nvlink_crc_flit_errors is None and c.nvlink_crc_data_errors is None
     else f"{_count(c.nvlink_crc_flit_errors)} flit, {_count(c.nvlink_crc_data_errors)} data",
     "corrupted NVLink transfers, summed over links"),
    ("NVLink replays, recoveries", lambda c: NA if c.nvlink_replay_errors is None and c.nvlink_recovery_errors is None
     else f"{_count(c.nvlink_replay_errors)}, {_count(c.nvlink_recovery_errors)}",
     "transfers sent again, and links retrained; climbing: a bad bridge or baseboard"),
    ("Throttled, last minute", lambda c: NA if c.throttled_power_pct is None and c.throttled_thermal_pct is None
     else f"power {_pct(c.throttled_power_pct)}, thermal {_pct(c.throttled_thermal_pct)}, "
          f"HW slowdown {_pct(c.throttled_hw_slowdown_pct)}", "how much of the last minute the clocks were held down"),
    ("Clock-event time", _clocks, "time each reason held the clocks down since the driver loaded"),
    ("Recovery action", lambda c: NA if c.recovery_action is None else c.recovery_action,
     "what the driver asks to be done after an uncorrectable error (none: nothing)"),
    ("GPM: SM active, occupancy", lambda c: NA if c.sm_active is None and c.sm_occupancy is None
     else f"{_pct(c.sm_active)}, {_pct(c.sm_occupancy)}", "Hopper and later: SMs with work, warps resident"),
    ("GPM: tensor, DRAM active", lambda c: NA if c.tensor_active is None and c.dram_active is None
     else f"{_pct(c.tensor_active)}, {_pct(c.dram_active)}", "tensor-core activity, memory bandwidth in use"),
]


def health_table(gpu: GpuSample) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column()
    table.add_row(Text("Card", style="bold underline"), Text(f"GPU {gpu.index}  {gpu.name}  {gpu.uuid or ''}"))
    verdict = gpu.health
    word = verdict.verdict.upper() if verdict is not None else "unknown (the source reports no health)"
    table.add_row(Text("Verdict", style="bold underline"),
                  Text(word, style=VERDICT_STYLE.get(verdict.verdict, "") if verdict else "dim"))
    for reason in verdict.reasons if verdict is not None else ():
        table.add_row(Text(reason.code, style="bold"), Text(reason.text))
        table.add_row(Text(""), Text(f"→ {reason.action}", style="italic"))
    if verdict is not None and not verdict.reasons:
        table.add_row(Text(""), Text("no health rule fires on this card", style="dim"))
    return table


def counters_table(gpu: GpuSample) -> Table:
    """Every counter: what it is, its value (N/A: not reported), what it means."""
    table = Table.grid(padding=(0, 2))
    table.add_column(no_wrap=True)
    table.add_column(max_width=30)
    table.add_column(style="dim")
    table.add_row(Text("Counters", style="bold underline"), Text(""), Text(""))
    counters = gpu.counters or CardCounters()
    for label, value, meaning in COUNTERS:
        shown = value(counters)
        table.add_row(Text(label), Text(shown, style="dim" if shown == NA else ""), Text(meaning))
    return table


class HealthScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,h", "dismiss", "Close")]

    def __init__(self, gpu: GpuSample) -> None:
        super().__init__()
        self.gpu = gpu

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="health-body") as body:
            body.border_title = f"Health · GPU {self.gpu.index}"  # the card's name (the driver's) is in the table
            body.border_subtitle = "Esc to close"
            yield Static(health_table(self.gpu))
            yield Static(counters_table(self.gpu), classes="health-counters")
