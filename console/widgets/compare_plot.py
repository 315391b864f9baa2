"""One graph of the compare view (console/screens/compare.py): a metric of several runs, one colour a
run (the legend above the graphs names them), on the x range the view shares between its graphs."""

from __future__ import annotations

from console.core.compare import Line
from console.widgets.cached_plot import CachedPlot
from console.widgets.ticks import nice_ticks, tick_label

# One colour a run (by its number, so a run keeps its colour when others are hidden): distinct on a
# dark and on a light background. Past nine runs the colours repeat.
PALETTE = [
    (70, 190, 240),
    (245, 130, 48),
    (60, 180, 75),
    (240, 50, 230),
    (255, 225, 25),
    (230, 25, 75),
    (150, 120, 255),
    (170, 255, 195),
    (250, 190, 212),
]


def run_colour(i: int) -> tuple[int, int, int]:
    return PALETTE[i % len(PALETTE)]


def rich_colour(i: int) -> str:
    r, g, b = run_colour(i)
    return f"rgb({r},{g},{b})"


def y_ticks(lines: list[Line]) -> tuple[list[float], list[str]]:
    """Round y ticks just covering the lines' values (no lines: none)."""
    ys = [y for ln in lines for y in ln.ys]
    if not ys:
        return [], []
    yt = nice_ticks(min(ys), max(ys), 3, inside=False)
    if len(yt) < 2:
        return [], []
    return yt, [tick_label(v, yt[1] - yt[0]) for v in yt]


class ComparePlot(CachedPlot):
    """Redrawn only when ``draw`` is given another key (data version, view, width). The y tick labels
    are padded to ``ywidth``: graphs stacked with the same width of labels have their x axes aligned."""

    DEFAULT_CSS = "ComparePlot { height: 1fr; min-height: 5; }"

    def draw(
        self,
        key: tuple,
        title: str,
        lines: list[Line],
        xlim: tuple[float, float] | None,
        xlabel: str,
        ywidth: int = 0,
    ) -> None:
        if key == self._seen:
            return
        self._seen = key
        plt = self.plt
        plt.clear_data()
        plt.title(title if lines else f"{title}: none yet")
        plt.xlabel(xlabel)
        for ln in lines:
            c = run_colour(ln.run)
            if ln.points:  # measured values: few, large markers joined by a line
                plt.plot(ln.xs, ln.ys, marker="hd", color=c)
                plt.scatter(ln.xs, ln.ys, marker="●", color=c)
            else:
                plt.plot(ln.xs, ln.ys, marker="braille", color=c)
        if xlim is not None and lines:
            self._ticks(xlim, *y_ticks(lines), ywidth)
        self.refresh()

    def _ticks(self, xlim: tuple[float, float], yt: list[float], ylabels: list[str], ywidth: int) -> None:
        plt = self.plt
        lo, hi = xlim
        if hi > lo:
            plt.xlim(lo, hi)
        xt = nice_ticks(lo, hi, 5)
        if len(xt) >= 2:
            plt.xticks(xt, [tick_label(v, xt[1] - xt[0]) for v in xt])
        if yt:
            plt.ylim(yt[0], yt[-1])
            plt.yticks(yt, [label.rjust(ywidth) for label in ylabels])
