"""The compare view's body (console/tui/compare_screen.py): a title line, a legend (one line a run: its
colour, number, label, state and newest figures) and three graphs stacked on one x range: loss,
acceptance length (the estimate as a line, the measured values as ●), tok/s."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from console.core.compare import CompareData, CompareView, Latest, figures, latest
from console.core.formatting import fmt_tok_s
from console.widgets.compare_plot import ComparePlot, rich_colour, y_ticks

TITLES = {
    "loss": "loss",
    "accept": "acceptance length (line: estimate, ●: measured)",
    "tok_s": "tok/s (drafters' sum, 10 s mean)",
}
MAX_LEGEND = 9  # legend lines (the runs 1..9 can toggle); more runs: one line says how many


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def legend_line(i: int, label: str, state: str, v: Latest, shown: bool, width: int = 12) -> Text:
    """Run i's legend line; ``label`` already cleaned (console.core.compare.run_label)."""
    t = Text(no_wrap=True, overflow="ellipsis")
    if not shown:
        t.append(f"    {i + 1} {label:<{width}}", style="dim")
        t.append(f"  hidden ({i + 1} shows it)", style="dim italic")
        return t
    t.append(" ━━ ", style=f"bold {rich_colour(i)}")
    t.append(f"{i + 1} ", style="bold cyan")
    t.append(f"{label:<{width}}", style=f"bold {rich_colour(i)}")
    t.append(f"  {state:<10}", style="dim")
    if v.step is None:
        t.append("  no step records yet", style="dim")
        return t
    t.append(f"  step {v.step:,}" + (f" / {v.total:,}" if v.total else ""))
    t.append(f"  loss {_f(v.loss, '.4f')}")
    t.append(f"  accept {_f(v.accept_est, '.2f')} est")
    if v.accept_eval is not None:
        t.append(f", {v.accept_eval:.2f} measured")
    t.append(f"  tok/s {fmt_tok_s(v.tok_s)}")
    return t


def title_line(view: CompareView, note: str | None) -> Text:
    t = Text(f" compare {len(view.chosen)} of {view.n_runs} runs", style="bold")
    if note:
        t.append(f"   {note}", style="bold yellow")
    t.append(f"   x: {view.by}", style="bold")
    t.append(f"   smoothing: {'EMA ' + format(view.weight, 'g') if view.weight else 'none'}", style="bold")
    t.append("   1-9: show/hide a run", style="dim")
    return t


class ComparePanel(Vertical):
    DEFAULT_CSS = """
    ComparePanel { height: 1fr; }
    ComparePanel #cmp-title { height: 1; background: $panel; }
    ComparePanel #cmp-legend { height: auto; }
    """

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.plots = {m: ComparePlot(id=f"cmp-{m}") for m in TITLES}
        self._legend_key: tuple | None = None
        self._plots_key: tuple | None = None

    def compose(self) -> ComposeResult:
        yield Static("", id="cmp-title")
        yield Static("", id="cmp-legend")
        yield from self.plots.values()

    def show_title(self, view: CompareView, note: str | None) -> None:
        self.query_one("#cmp-title", Static).update(title_line(view, note))

    def show(
        self, data: CompareData, view: CompareView, runs: list[tuple[str, str]], plots: bool = True
    ) -> None:
        """The legend when a series, a run's state or the choice changed (``runs``: label, state); with
        ``plots`` the graphs too when a series, the choice or the width changed."""
        key = (data.version, view.key(), tuple(runs))
        if key != self._legend_key:
            self._legend_key = key
            self._legend(data, view, runs)
        bins = max(20, self.plots["loss"].size.width - 8)  # about the plot area's columns
        key = (data.version, view.key(), bins)
        if plots and key != self._plots_key:
            self._plots_key = key
            self._plots(data, view, bins, key)

    def _plots(self, data: CompareData, view: CompareView, bins: int, key: tuple) -> None:
        figs = figures(data, view, bins)
        ywidth = max((len(label) for m in TITLES for label in y_ticks(figs.lines[m])[1]), default=0)
        w = view.weight
        for metric, plot in self.plots.items():
            smoothed = ("  (estimate EMA " if metric == "accept" else "  (EMA ") + f"{w:g})" if w else ""
            plot.draw(key, TITLES[metric] + smoothed, figs.lines[metric], figs.xlim, figs.xlabel, ywidth)

    def _legend(self, data: CompareData, view: CompareView, runs: list[tuple[str, str]]) -> None:
        shown = runs[:MAX_LEGEND]
        width = max((len(label) for label, _ in shown), default=0)
        lines = [
            legend_line(i, label, state, latest(data.runs[i]), i in view.chosen, width)
            for i, (label, state) in enumerate(shown)
        ]
        if len(runs) > MAX_LEGEND:
            more = f"    … {len(runs) - MAX_LEGEND} more runs (shown: {len(view.chosen)})"
            lines.append(Text(more, style="dim"))
        self.query_one("#cmp-legend", Static).update(Text("\n").join(lines))
