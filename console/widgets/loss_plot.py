"""Training loss by step, from step records."""

from __future__ import annotations

from console.core.state import ConsoleState
from console.widgets.cached_plot import CachedPlot
from console.widgets.ticks import apply_ticks


class LossPlot(CachedPlot):
    """Redrawn only when a step record arrived since the last draw."""

    DEFAULT_CSS = "LossPlot { height: 1fr; min-height: 6; }"

    def on_mount(self) -> None:
        super().on_mount()
        self.plt.title("loss")
        self.plt.xlabel("step")

    def update_from(self, state: ConsoleState) -> None:
        hist = state.loss_hist
        key = (len(hist), hist[-1] if hist else None)
        if key == self._seen:
            return
        self._seen = key
        plt = self.plt
        plt.clear_data()
        if hist:
            xs, ys = [h[0] for h in hist], [h[1] for h in hist]
            plt.plot(xs, ys, marker="braille", color="yellow")
            apply_ticks(plt, xs, ys)
        self.refresh()
