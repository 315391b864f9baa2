"""Queue gauge: hidden-state batches waiting between the target and the drafters, against capacity."""

from __future__ import annotations

from rich.text import Text

from console.core.state import ConsoleState
from console.widgets.liveness import rates_live
from console.widgets.text_widget import TextWidget


def gauge_text(depth: int | None, capacity: int | None, width: int) -> Text:
    """``queue ▕█████░░░░░▏ 12/60``; an empty queue means the drafters wait on the target,
    a full one that the target waits on the drafters."""
    label = "queue "
    if depth is None or not capacity:
        return Text(label + "-", style="dim")
    tail = f" {depth}/{capacity}"
    hint = "  drafters starved" if depth == 0 else "  target blocked" if depth >= capacity else ""
    bar_w = max(4, width - len(label) - len(tail) - len(hint) - 2)
    frac = min(1.0, max(0.0, depth / capacity))
    full = round(frac * bar_w)
    style = "red" if depth == 0 else "yellow" if frac >= 0.95 else "green"
    t = Text(label, style="bold")
    t.append("▕")
    t.append("█" * full, style=style)
    t.append("░" * (bar_w - full), style="dim")
    t.append("▏")
    t.append(tail)
    if hint:
        t.append(hint, style=style)
    return t


class QueueGauge(TextWidget):
    DEFAULT_CSS = "QueueGauge { height: 1; }"

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._last: tuple[int | None, int | None] = (None, None)

    def update_from(self, state: ConsoleState) -> None:
        live = rates_live(state)  # no trainer (or one still starting): no queue to show
        self._last = (state.queue_depth, state.queue_capacity) if live else (None, None)
        self.set_content(gauge_text(*self._last, self.size.width or 40))

    def on_resize(self) -> None:
        self.set_content(gauge_text(*self._last, self.size.width or 40))
