"""tok/s over time: the headline (drafters' sum) and the target role's sum, from throughput records."""

from __future__ import annotations

from console.core.state import ConsoleState
from console.widgets.cached_plot import CachedPlot
from console.widgets.ticks import apply_ticks


class TokSPlot(CachedPlot):
    """Redrawn only when a throughput record arrived since the last draw.

    x is seconds before the newest record (record time, not the clock), so the graph is the same
    whenever it is drawn.
    """

    DEFAULT_CSS = "TokSPlot { height: 1fr; min-height: 6; }"

    def __init__(self, window_s: float = 300.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.window_s = window_s

    def on_mount(self) -> None:
        super().on_mount()
        self.plt.xlabel("s ago")

    def update_from(self, state: ConsoleState) -> None:
        hist = state.tok_hist
        key = (len(hist), hist[-1][0] if hist else None)
        if key == self._seen:
            return
        self._seen = key
        plt = self.plt
        plt.title(f"tok/s, {state.avg_window_s:g} s mean")  # 'total' is the drafters' sum (the panel says so)
        plt.clear_data()
        if hist:
            t_end = hist[-1][0]
            pts = [h for h in hist if t_end - h[0] <= self.window_s]
            xs = [h[0] - t_end for h in pts]
            ys = [h[1] for h in pts]
            plt.plot(xs, ys, label="total", marker="braille", color="cyan")
            if any("target" in h[2] for h in pts):
                target = [h[2].get("target", 0.0) for h in pts]
                plt.plot(xs, target, label="target", marker="braille", color="magenta")
                ys = ys + target
            apply_ticks(plt, xs, ys)
        self.refresh()
