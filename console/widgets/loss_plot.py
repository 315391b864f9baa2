"""Training loss by step, from step records."""

from __future__ import annotations

from textual_plotext import PlotextPlot

from console.core.state import ConsoleState


class LossPlot(PlotextPlot):
    """Redrawn only when a step record arrived since the last draw."""

    DEFAULT_CSS = "LossPlot { height: 1fr; min-height: 6; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._seen: tuple | None = None
        self._render_key: tuple | None = None
        self._rendered = None

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
            plt.plot([h[0] for h in hist], [h[1] for h in hist], marker="braille", color="yellow")
        self.refresh()

    def render(self):
        """plotext rebuilds the whole figure per render; reuse it until the data or size changes."""
        key = (self._seen, self.size, self.app.theme)
        if key != self._render_key:
            self._render_key = key
            self._rendered = super().render()
        return self._rendered
