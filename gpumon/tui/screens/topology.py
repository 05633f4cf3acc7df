"""`t`: the link matrix (as `nvidia-smi topo -m`), the selected card's row and column highlighted,
links coloured by quality, and that card's best partners in order.

It opens at once with what is known (the cards, their CPUs) and fills in as each card's links are
read; a card that does not answer is left out, and the view says so."""

from __future__ import annotations

from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpumon.cards.topology import best_partners, describe_link, link_rank
from gpumon.model import Topology
from gpumon.sanitize import printable
from gpumon.tui.literal_text import plain

LEGEND = ("X self · NV# NVLinks · XGMI AMD xGMI hive · PIX one PCIe switch · PXB several switches · "
          "PHB host bridge · NODE same NUMA node · SYS across sockets")


class TopologyScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,q,t", "dismiss", "Close"),
        Binding("up,k", "move(-1)", "Prev card"),
        Binding("down,j", "move(1)", "Next card"),
    ]

    def __init__(self, topo: Topology, selected: int, reading: bool = False) -> None:
        super().__init__()
        self.topo = topo
        self.reading = reading  # links are still being read
        self.selected = selected if selected in topo.indices else (topo.indices[0] if topo.indices else 0)

    def show_topology(self, topo: Topology, reading: bool) -> None:
        """Links read so far (`reading`), or all there will be."""
        self.topo, self.reading = topo, reading
        if self.selected not in topo.indices and topo.indices:
            self.selected = topo.indices[0]
        if self.is_attached:
            self._draw()

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="topo-body") as body:
            body.border_title = "Topology"
            body.border_subtitle = "↑/↓ card · Esc close"
            yield Static(id="topo-matrix")
            yield Static(id="topo-partners")
            yield Static(LEGEND, id="topo-legend")

    def on_mount(self) -> None:
        self._draw()

    def action_move(self, delta: int) -> None:
        if self.topo.indices:
            pos = self.topo.indices.index(self.selected)
            self.selected = self.topo.indices[(pos + delta) % len(self.topo.indices)]
            self._draw()

    def _quality(self, link: str | None) -> Style:
        theme = self.app.current_theme
        rank = link_rank(link)
        if link == "X":
            return Style(dim=True)
        colour = (theme.success if rank < 1 else theme.primary if rank <= 2
                  else theme.warning if rank <= 4 else theme.error)
        return Style(color=colour, bold=rank < 1)

    def _draw(self) -> None:
        topo = self.topo
        self.query_one("#topo-body").border_title = "Topology · reading links…" if self.reading else "Topology"
        if not topo.indices:
            self.query_one("#topo-matrix", Static).update(Text("No cards." + _left_out(topo)))
            return
        accent = Style(bgcolor=self.app.current_theme.panel, bold=True)
        table = Table(box=None, padding=(0, 1), show_edge=False, pad_edge=False)
        table.add_column("")
        for idx in topo.indices:
            table.add_column(f"GPU{idx}", justify="center", header_style=accent if idx == self.selected else "bold")
        table.add_column("CPU Affinity")
        table.add_column("NUMA", justify="right")
        for i, idx in enumerate(topo.indices):
            cells = []
            for j, other in enumerate(topo.indices):
                link = topo.links[i][j]
                style = self._quality(link)
                if self.selected in (idx, other):
                    style += Style(bgcolor=self.app.current_theme.panel)
                cells.append(Text(link or ("…" if self.reading else "N/A"), style=style))
            name_style = accent if idx == self.selected else Style(bold=True)
            numa = topo.numa_node[i]
            # The CPU affinity is the host's own words (over ssh for a fleet host): text, not markup.
            table.add_row(Text(f"GPU{idx}", style=name_style), *cells, plain(topo.cpu_affinity[i] or "N/A"),
                          "N/A" if numa is None else str(numa))
        self.query_one("#topo-matrix", Static).update(table)
        partners = best_partners(topo, self.selected)
        text = Text(f"\nBest partners for GPU {self.selected}: ", style="bold")
        text.append(", ".join(f"GPU {o} ({describe_link(link) if link else '…'})" for o, link in partners) or "none")
        text.append(_left_out(topo))
        self.query_one("#topo-partners", Static).update(text)


def _left_out(topo: Topology) -> str:
    return ("".join(f"\nGPU {index} left out: {printable(reason)}" for index, reason in topo.left_out)
            + "".join(f"\nGPU {index} {printable(reason)}" for index, reason in topo.unknown))
