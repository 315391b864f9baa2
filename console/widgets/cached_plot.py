"""A plotext plot that renders its figure once per change of data, size or theme."""

from __future__ import annotations

from textual_plotext import PlotextPlot


class CachedPlot(PlotextPlot):
    """plotext rebuilds the whole figure on every render; this reuses it until ``_seen`` (the data key
    a subclass sets when it redraws), the size or the theme changes."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._seen: tuple | None = None
        self._render_key: tuple | None = None
        self._rendered = None

    def render(self):
        key = (self._seen, self.size, self.app.theme)
        if key != self._render_key:
            self._render_key = key
            self._rendered = super().render()
        return self._rendered
