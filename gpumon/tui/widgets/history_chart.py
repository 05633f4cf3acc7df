"""A history chart of one metric of the selected card, drawn with plotext.

Drawing costs milliseconds, so a chart redraws only when it is visible and its data or size
changed, and the series is first reduced to the plot's resolution (2 points per cell).
"""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

WINDOWS = (60, 300, 600)  # seconds; the `w` key cycles them
UNITS = {"util": ("GPU utilisation", "%", 100.0), "mem": ("Memory used", "%", 100.0),
         "temp": ("Temperature", "°C", None), "power": ("Power", "W", None),
         # One process's (the process screen's charts)
         "proc_mem": ("GPU memory", " MiB", None), "proc_sm": ("SM", "%", 100.0), "proc_cpu": ("CPU", "%", None)}
# The least top of a chart whose values have no upper bound: a process's CPU % passes 100 with
# several cores, and below that its axis is 0-100 % like the others (a flat 0 read 1 / 1 / 0).
FLOORS = {"proc_cpu": 100.0}


def _window_label(seconds: float) -> str:
    return f"-{seconds / 60:g}m" if seconds >= 60 else f"-{seconds:g}s"


def downsample(values: list[float | None], points: int) -> list[float | None]:
    """Keep the max of each bucket, so short spikes stay visible."""
    if len(values) <= points or points <= 0:
        return values
    out: list[float | None] = []
    step = len(values) / points
    for i in range(points):
        bucket = [v for v in values[int(i * step): int((i + 1) * step) or None] if v is not None]
        out.append(max(bucket) if bucket else None)
    return out


def _tick(value: float, top: float) -> str:
    return f"{value:.0f}" if top >= 10 else f"{value:.1f}"  # small tops: labels that differ


def render_chart(values: list[float | None], slots: int, width: int, height: int, window: float,
                 upper: float | None, title: str, floor: float = 1.0) -> str:
    """The chart as plain text (no colour codes: the widget styles it from the theme).

    `slots` samples fill the window; the newest value sits at the right edge, so a short
    history occupies only the right part of the chart, as time does.
    """
    points = max(2, 2 * (width - 6))
    if slots > points:
        values = downsample(values, max(1, round(len(values) * points / slots)))
        slots = points
    slots = max(slots, len(values), 2)
    import plotext  # 90 ms to import: only once a chart is actually drawn, not before the first frame

    # The widget gives the size: never cut to the size of the terminal gpumon runs in (or of none, 80x24).
    plotext.terminal.limit(False, False)
    fig = plotext.figure
    fig.clear()
    fig.plot_size(width, height)
    fig.theme("colorless")
    fig.title(title)
    known = [v for v in values if v is not None]
    top = upper if upper is not None else max(floor, max([0.0] + known) * 1.15)
    fig.ruler("y").lim(0, top)
    fig.ruler("y").ticks([0, top / 2, top], ["0", _tick(top / 2, top), _tick(top, top)])
    fig.ruler("x").lim(1, slots)
    fig.ruler("x").ticks([1, slots], [_window_label(window), "now"])
    if known:
        # Gaps (card lost) are drawn at 0 rather than bridged: a lost card did no work.
        xs = list(range(slots - len(values) + 1, slots + 1))
        fig.draw(fig.signal(xs, [v if v is not None else 0 for v in values]).lines(True).fillx(True))
    return fig.build().string().replace("\x1b[0m", "")


class HistoryChart(Widget):
    COMPONENT_CLASSES = {"history-chart--line"}

    def __init__(self, metric: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.metric = metric
        self.values: list[float | None] = []
        self.slots = 2
        self.window = WINDOWS[0]
        self.card_label = ""
        self._drawn_key: tuple | None = None
        self._text = Text("")

    def show(self, values: list[float | None], slots: int, window: float, card_label: str) -> None:
        """`values`: the last `window` seconds of samples; `slots`: how many samples fill it;
        `card_label`: whose values they are, in the title ("": the screen says whose)."""
        self.values, self.slots, self.window, self.card_label = values, slots, window, card_label
        if self.display and self.size.width > 0:
            self.refresh()

    def render(self) -> Text:
        width, height = self.size.width, self.size.height
        key = (tuple(self.values[-2 * width:]), len(self.values), self.slots, width, height, self.window,
               self.card_label)
        if key != self._drawn_key and width >= 20 and height >= 5:
            self._drawn_key = key
            name, unit, upper = UNITS[self.metric]
            latest = next((v for v in reversed(self.values) if v is not None), None)
            now = f" {latest:.0f}{unit}" if latest is not None else " N/A"
            text = render_chart(self.values, self.slots, width, height, self.window, upper,
                                f"{name} ({self.card_label}){now}" if self.card_label else f"{name}{now}",
                                FLOORS.get(self.metric, 1.0))
            self._text = Text(text, style=self.get_component_rich_style("history-chart--line"), no_wrap=True)
        return self._text
