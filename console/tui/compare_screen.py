"""The compare view: loss, acceptance length and tok/s of several runs on shared axes, one colour a
run, opened from the overview (``c``: the marked runs, else all) of a live fleet or a replay.

The app gives ``compare`` (console.core.compare.CompareData, fed the same events as each run's state)
and ``runs`` (console.core.fleet.Run). The three graphs share one x range, by step or by time since
each run's first record (``x``); ``e`` cycles the smoothing (EMA 0, 0.6, 0.9); ``1``..``9`` show or
hide run N, ``a`` shows all. The legend is redrawn every ``refresh_s`` when a series or a run's state
changed, the graphs at most every ``plot_refresh_s`` (as the main screen's) or at once on a key. Help (``?``) lists the keys that work here, from the live bindings. (Here, above
the app, because it puts a widget (console/widgets/compare_panel.py) on a screen of its own.)
"""

from __future__ import annotations

import time

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import Screen
from textual.widgets import Footer

from console.core.compare import CompareView, run_label
from console.core.fleet import run_state
from console.screens.compare_help import CompareHelp, binding_rows
from console.widgets.compare_panel import ComparePanel


class CompareScreen(Screen):
    BINDINGS = [
        Binding("x", "toggle_x", "Step/time", tooltip="x axis: step, or time since each run's first record"),
        Binding("e", "smooth", "Smoothing", tooltip="EMA weight 0 / 0.6 / 0.9 (not the measured points)"),
        Binding("a", "all_runs", "All runs", tooltip="show every run"),
        *[Binding(str(i), f"toggle_run({i - 1})", f"Run {i}", show=False) for i in range(1, 10)],
        Binding("escape", "close", "Back", tooltip="back to where it was opened from"),
        Binding("question_mark", "help", "Help", tooltip="these keys"),
    ]

    def __init__(
        self, chosen: set[int] | None = None, refresh_s: float = 0.2, plot_refresh_s: float = 1.0
    ) -> None:
        super().__init__()
        self.chosen = set(chosen or ())
        self.refresh_s = refresh_s
        self.plot_refresh_s = plot_refresh_s
        self._last_plot = 0.0
        self.view: CompareView | None = None
        self.panel = ComparePanel()

    def compose(self) -> ComposeResult:
        yield self.panel
        yield Footer()

    def on_mount(self) -> None:
        self.view = CompareView(len(self.app.runs), self.chosen)
        self.call_after_refresh(self.redraw, True)  # once laid out: the graphs know their width
        self.set_interval(self.refresh_s, self.redraw)

    def on_screen_resume(self) -> None:
        self.redraw(True)

    def redraw(self, now: bool = False) -> None:
        """The title (the replay's cursor moves) and the legend; the graphs when due (``now``: at once)."""
        if self.view is None or not self.is_current:
            return
        note = getattr(self.app, "overview_note", None)  # the replay's cursor
        self.panel.show_title(self.view, note() if callable(note) else None)
        runs = [(run_label(r.target.title), run_state(r.state)) for r in self.app.runs]
        t = time.monotonic()
        plots = now or t - self._last_plot >= self.plot_refresh_s
        if plots:
            self._last_plot = t
        self.panel.show(self.app.compare, self.view, runs, plots)

    def action_toggle_x(self) -> None:
        self.view.toggle_x()
        self.redraw(True)

    def action_smooth(self) -> None:
        self.view.cycle_smoothing()
        self.redraw(True)

    def action_toggle_run(self, i: int) -> None:
        self.view.toggle_run(i)
        self.redraw(True)

    def action_all_runs(self) -> None:
        self.view.show_all()
        self.redraw(True)

    def action_close(self) -> None:
        self.app.pop_screen()

    def action_help(self) -> None:
        self.app.push_screen(CompareHelp(binding_rows(self)))


def open_compare(app, chosen: set[int]) -> None:
    """Put the compare view of ``chosen`` (none: every run) on screen, unless it is there already."""
    if not isinstance(app.screen, CompareScreen):
        app.push_screen(CompareScreen(chosen))
