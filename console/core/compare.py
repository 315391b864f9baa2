"""The compare view's data (console/screens/compare.py): the curves of several runs on shared axes.

:class:`CompareData` keeps one :class:`~console.core.compare_series.RunSeries` per run, fed the same
session events as the run's state (the fleet app's and the replay's fold), so it holds what the
session read: a live run's records and those of a run that has ended alike. :class:`CompareView` is
what the user chose (which runs, x by step or by time, the smoothing); :func:`figures` turns both
into the lines of the three graphs (loss, acceptance length, tok/s) with one x range for all three.

By time, x is the time since the run's first record the session read, so runs started on
different days still start together. Smoothing is TensorBoard's: an exponential moving average
with weight w (0 = none), debiased at the start; it smooths the estimate, loss and tok/s lines,
never the measured acceptance points. Lines are thinned for drawing to the lowest and highest
point of each of ``bins`` x buckets (a spike stays visible). No Textual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from console.core.compare_series import CAP, Point, RunSeries
from console.core.events import Record
from console.core.sanitize import clean_text

SMOOTHING = (0.0, 0.6, 0.9)  # EMA weights the smoothing key cycles through
X_MODES = ("step", "time")
METRICS = ("loss", "accept", "tok_s")
LABEL_MAX = 28  # a run's label in the legend, at most this many characters


class CompareData:
    """A :class:`RunSeries` per run; ``apply(i, event)`` folds run i's session event."""

    def __init__(self, n_runs: int, cap: int = CAP) -> None:
        self.runs = [RunSeries(cap) for _ in range(n_runs)]

    def apply(self, i: int, event: object) -> None:
        if isinstance(event, Record) and 0 <= i < len(self.runs) and isinstance(event.record, dict):
            self.runs[i].apply(event.record)

    def reset(self) -> None:
        """Forget everything (a replay folding its record again from the start)."""
        for r in self.runs:
            r.reset()

    @property
    def version(self) -> tuple[int, ...]:
        return tuple(r.version for r in self.runs)


@dataclass
class CompareView:
    """What the compare view shows: ``chosen`` run indices, ``by`` step or time, ``smooth`` index."""

    n_runs: int
    chosen: set[int] = field(default_factory=set)
    by: str = "step"
    smooth: int = 0

    def __post_init__(self) -> None:
        self.chosen = {i for i in self.chosen if 0 <= i < self.n_runs} or set(range(self.n_runs))

    @property
    def weight(self) -> float:
        return SMOOTHING[self.smooth]

    def toggle_x(self) -> None:
        self.by = X_MODES[(X_MODES.index(self.by) + 1) % len(X_MODES)]

    def cycle_smoothing(self) -> None:
        self.smooth = (self.smooth + 1) % len(SMOOTHING)

    def toggle_run(self, i: int) -> None:
        """Show or hide run i; the last run shown stays."""
        if not 0 <= i < self.n_runs:
            return
        if i not in self.chosen:
            self.chosen.add(i)
        elif len(self.chosen) > 1:
            self.chosen.discard(i)

    def show_all(self) -> None:
        self.chosen = set(range(self.n_runs))

    def key(self) -> tuple:
        return (tuple(sorted(self.chosen)), self.by, self.smooth)


def run_label(text: object, limit: int = LABEL_MAX) -> str:
    """A run's label as the screen may show it: cleaned (console/core/sanitize.py), one line, elided."""
    s = " ".join(clean_text(str(text)).split())
    return s if len(s) <= limit else s[: limit - 1] + "…"


# ---- lines ------------------------------------------------------------------------------------------


def ema(ys: Sequence[float], weight: float) -> list[float]:
    """TensorBoard's smoothing: ``s = w * s + (1 - w) * y``, divided by ``1 - w**n`` (no pull to 0)."""
    if weight <= 0:
        return list(ys)
    out, s, wn = [], 0.0, 1.0
    for y in ys:
        s = weight * s + (1 - weight) * y
        wn *= weight
        out.append(s / (1 - wn))
    return out


def thin(xs: list[float], ys: list[float], bins: int) -> tuple[list[float], list[float]]:
    """At most two points per x bucket (its lowest and highest, in order): a line drawn ``bins`` cells
    wide looks the same, and costs a bounded amount to draw."""
    lo, hi = xs[0] if xs else 0.0, xs[-1] if xs else 0.0
    if len(xs) <= 2 * bins or bins < 1 or hi <= lo:
        return xs, ys
    width = (hi - lo) / bins

    def bucket(x: float) -> int:
        return min(bins - 1, int((x - lo) / width))

    keep: list[int] = []
    start = 0
    for i in range(1, len(xs) + 1):
        if i == len(xs) or bucket(xs[i]) != bucket(xs[start]):
            seg = range(start, i)
            a, b = min(seg, key=ys.__getitem__), max(seg, key=ys.__getitem__)
            keep.extend(sorted({a, b}))
            start = i
    return [xs[i] for i in keep], [ys[i] for i in keep]


def xy(points: list[Point], by: str, t0: float | None) -> tuple[list[float], list[float]]:
    """x (step, or seconds since ``t0``) and y of the points that have that x. By step, of several
    points at one step (tok/s: a throughput record every half second) the last one stands."""
    xs: list[float] = []
    ys: list[float] = []
    for step, t, v in points:
        if by == "step":
            if step is None:
                continue
            x = float(step)
            if xs and xs[-1] == x:
                ys[-1] = v
                continue
        else:
            if t is None or t0 is None:
                continue
            x = t - t0
        xs.append(x)
        ys.append(v)
    return xs, ys


@dataclass
class Line:
    run: int
    xs: list[float]
    ys: list[float]
    points: bool = False  # measured values: markers (joined), not a smoothed line


@dataclass
class Figures:
    lines: dict[str, list[Line]]  # METRICS -> lines
    xlim: tuple[float, float] | None  # one x range for the three graphs
    xlabel: str


def time_unit(span_s: float) -> tuple[float, str]:
    """(seconds per unit, name) for an x axis spanning ``span_s`` seconds."""
    if span_s >= 3 * 3600:
        return 3600.0, "h"
    if span_s >= 600:
        return 60.0, "min"
    return 1.0, "s"


def _run_lines(r: RunSeries, i: int, view: CompareView, bins: int) -> dict[str, list[Line]]:
    out: dict[str, list[Line]] = {m: [] for m in METRICS}
    for metric, series, smooth in (
        ("loss", r.loss, True),
        ("accept", r.accept_est, True),
        ("accept", r.accept_eval, False),
        ("tok_s", r.tok_s, True),
    ):
        xs, ys = xy(series.points(), view.by, r.t0)
        if not xs:
            continue
        if smooth:
            xs, ys = thin(xs, ema(ys, view.weight), bins)
        out[metric].append(Line(i, xs, ys, points=not smooth))
    return out


def figures(data: CompareData, view: CompareView, bins: int = 120) -> Figures:
    """The lines of the chosen runs for the three graphs, x by step or time since each run's start."""
    lines: dict[str, list[Line]] = {m: [] for m in METRICS}
    for i in sorted(view.chosen):
        if i < len(data.runs):
            for metric, ls in _run_lines(data.runs[i], i, view, bins).items():
                lines[metric].extend(ls)
    xs = [x for ls in lines.values() for ln in ls for x in (ln.xs[0], ln.xs[-1])]
    if view.by == "step":
        return Figures(lines, (min(xs), max(xs)) if xs else None, "step")
    unit, name = time_unit(max(xs) - min(xs) if xs else 0.0)
    if unit != 1.0:
        for ls in lines.values():
            for ln in ls:
                ln.xs = [x / unit for x in ln.xs]
    xlim = (min(xs) / unit, max(xs) / unit) if xs else None
    return Figures(lines, xlim, f"{name} since the run's first record")


@dataclass
class Latest:
    """A run's newest raw values (the legend's figures)."""

    step: int | None
    total: int | None
    loss: float | None
    accept_est: float | None
    accept_eval: float | None
    tok_s: float | None


def latest(r: RunSeries) -> Latest:
    def v(p: Point | None) -> float | None:
        return None if p is None else p[2]

    return Latest(
        r.step, r.total_steps, v(r.loss.last), v(r.accept_est.last), v(r.accept_eval.last), v(r.tok_s.last)
    )
