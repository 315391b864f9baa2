"""Round tick values for the plotext graphs: 0, 5K, 10K; 200, 400, 600 (not 12348.2, 77.0, 226.8)."""

from __future__ import annotations

import math

STEPS = (1.0, 2.0, 5.0, 10.0)


def nice_step(span: float, n: int) -> float:
    """The round step (1, 2 or 5 times a power of ten) giving about ``n`` ticks over ``span``."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, n)
    mag = 10.0 ** math.floor(math.log10(raw))
    return next(s * mag for s in STEPS if s * mag >= raw * 0.999)


def nice_ticks(lo: float, hi: float, n: int = 4, inside: bool = True) -> list[float]:
    """Multiples of a round step: within [lo, hi] (``inside``), else the ones that just cover it."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        lo, hi = (lo - 1, hi + 1) if lo == 0 else (lo - abs(lo) * 0.1, hi + abs(hi) * 0.1)
    step = nice_step(hi - lo, n)
    first = math.ceil(lo / step - 1e-9) if inside else math.floor(lo / step + 1e-9)
    last = math.floor(hi / step + 1e-9) if inside else math.ceil(hi / step - 1e-9)
    return [round(k * step, 12) for k in range(first, last + 1)]


def tick_label(v: float, step: float) -> str:
    """``12K``, ``2.5K``, ``400``, ``0.25``: as many decimals as the step needs, no more."""
    if abs(v) >= 10_000 or (step >= 1000 and v != 0):
        return _fixed(v / 1000, step / 1000) + "K"
    return _fixed(v, step)


def _fixed(v: float, step: float) -> str:
    decimals = 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1
    s = f"{v:.{decimals}f}"
    return "0" if float(s) == 0 else s


def apply_ticks(plt, xs: list[float], ys: list[float], n_x: int = 4, n_y: int = 4) -> None:
    """Round ticks on both axes of a plotext figure: x ticks inside the data, y limits widened to the
    round values around it."""
    if not xs or not ys:
        return
    xt = nice_ticks(min(xs), max(xs), n_x)
    if len(xt) >= 2:
        plt.xticks(xt, [tick_label(v, xt[1] - xt[0]) for v in xt])
    yt = nice_ticks(min(ys), max(ys), n_y, inside=False)
    if len(yt) >= 2:
        plt.ylim(yt[0], yt[-1])
        plt.yticks(yt, [tick_label(v, yt[1] - yt[0]) for v in yt])
