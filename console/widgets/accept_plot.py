"""Acceptance length by step: the measured value (``eval`` records) and the trainer's estimate
(``accept_len_est`` of step records), two series marked as such."""

from __future__ import annotations

from console.core.state import ConsoleState
from console.widgets.cached_plot import CachedPlot
from console.widgets.ticks import apply_ticks


class AcceptPlot(CachedPlot):
    """Redrawn only when a step or eval record changed either series since the last draw."""

    DEFAULT_CSS = "AcceptPlot { height: 1fr; min-height: 6; }"

    def on_mount(self) -> None:
        super().on_mount()
        self.plt.title("acceptance length: none yet")
        self.plt.xlabel("step")

    def update_from(self, state: ConsoleState) -> None:
        est, real = state.accept_est_hist, state.eval_hist
        key = (len(est), est[-1] if est else None, len(real), real[-1] if real else None)
        if key == self._seen:
            return
        self._seen = key
        plt = self.plt
        plt.clear_data()
        plt.title("acceptance length" if est or real else "acceptance length: none yet")
        if est:
            plt.plot(
                [h[0] for h in est], [h[1] for h in est], marker="braille", color="cyan", label="estimate"
            )
        if real:
            # few points (one per evaluated checkpoint): large markers joined by a line
            plt.plot([h[0] for h in real], [h[1] for h in real], marker="hd", color="green", label="eval")
            plt.scatter([h[0] for h in real], [h[1] for h in real], marker="●", color="green")
        both = [*est, *real]
        apply_ticks(plt, [h[0] for h in both], [h[1] for h in both])
        self.refresh()
