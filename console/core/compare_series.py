"""One run's curves for the compare view (console/core/compare.py): loss, acceptance length (the
trainer's estimate and the measured value) and tok/s, folded from the metrics records the session
delivers, each a capped, decimated series: memory stays bounded however long the run.

A :class:`Series` keeps at most ``cap`` points of the whole history: once full, every other kept
point is dropped and from then on only every second new point is kept (then every fourth, ...), so
the points stay evenly spread over the run; the newest point is always shown as well. No Textual.
"""

from __future__ import annotations

import math
from collections import deque

from console.core.metrics import headline_tok_s

CAP = 2000  # points kept per series (the whole run, decimated)
TOK_WINDOW_S = 10.0  # tok/s is the drafters' sum as a mean over this much record time (the main screen's)
TP_MAX = 512  # throughput records in that window, at most

Point = tuple[int | None, float | None, float]  # (step, t, value); step None: before the first step


def finite(v: object) -> float | None:
    """A finite number as float; None for anything else (bools, NaN, inf, strings)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def int_step(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class Series:
    """A capped, evenly decimated series of :data:`Point` (see the module's text)."""

    def __init__(self, cap: int = CAP) -> None:
        if cap < 4:
            raise ValueError(f"a series keeps at least 4 points (cap={cap})")
        self.cap = cap
        self._kept: list[Point] = []
        self._stride = 1  # keep every stride-th point offered
        self._n = 0  # points offered since the last reset
        self._last: Point | None = None

    def add(self, step: int | None, t: float | None, value: float) -> None:
        p = (step, t, value)
        if self._n % self._stride == 0:
            self._kept.append(p)
            if len(self._kept) >= self.cap:
                self._kept = self._kept[::2]
                self._stride *= 2
        self._n += 1
        self._last = p

    def drop_from(self, step: int) -> None:
        """Forget the points at ``step`` and later (a restart from an older checkpoint)."""
        self._kept = [p for p in self._kept if p[0] is None or p[0] < step]
        if self._last is not None and self._last[0] is not None and self._last[0] >= step:
            self._last = self._kept[-1] if self._kept else None

    def points(self) -> list[Point]:
        """The kept points and the newest one (at most ``cap``)."""
        if self._last is None or (self._kept and self._kept[-1] is self._last):
            return list(self._kept)
        return [*self._kept, self._last]

    @property
    def last(self) -> Point | None:
        return self._last

    def __len__(self) -> int:
        return len(self.points())


class RunSeries:
    """A run's four series, folded from its metrics records; ``version`` moves with every change."""

    def __init__(self, cap: int = CAP, window_s: float = TOK_WINDOW_S) -> None:
        self.cap = cap
        self.window_s = window_s
        self.reset()

    def reset(self) -> None:
        self.loss = Series(self.cap)
        self.accept_est = Series(self.cap)  # step records' accept_len_est
        self.accept_eval = Series(self.cap)  # eval records' accept_len (measured)
        self.tok_s = Series(self.cap)  # throughput records: drafters' sum, window mean
        self.step: int | None = None
        self.total_steps: int | None = None
        self.t0: float | None = None  # the first record's time: the origin of "by time"
        self._tp: deque[tuple[float, float]] = deque(maxlen=TP_MAX)  # bounded even if t runs backwards
        self.version = getattr(self, "version", 0) + 1

    def apply(self, rec: dict) -> None:
        """Fold one metrics record (unknown kinds and fields are ignored)."""
        kind, t = rec.get("kind"), finite(rec.get("t"))
        if kind == "step":
            changed = self._on_step(rec, t)
        elif kind == "eval":
            changed = self._on_eval(rec, t)
        elif kind == "throughput":
            changed = self._on_throughput(rec, t)
        else:
            return
        if changed:
            if self.t0 is None and t is not None:
                self.t0 = t
            self.version += 1

    def _on_step(self, rec: dict, t: float | None) -> bool:
        step = int_step(rec.get("step"))
        if step is None:
            return False
        if self.step is not None and step < self.step:  # restarted from an older checkpoint
            for s in (self.loss, self.accept_est, self.accept_eval, self.tok_s):
                s.drop_from(step)
        self.step = step
        total = int_step(rec.get("total_steps"))
        if total is not None:
            self.total_steps = total
        loss, est = finite(rec.get("loss")), finite(rec.get("accept_len_est"))
        if loss is not None:
            self.loss.add(step, t, loss)
        if est is not None:
            self.accept_est.add(step, t, est)
        return True

    def _on_eval(self, rec: dict, t: float | None) -> bool:
        step, value = int_step(rec.get("step")), finite(rec.get("accept_len"))
        if step is None or value is None:
            return False
        self.accept_eval.add(step, t, value)
        return True

    def _on_throughput(self, rec: dict, t: float | None) -> bool:
        if not isinstance(rec.get("devices"), list):
            return False
        v = finite(headline_tok_s(rec))
        if v is None:
            return False
        if t is not None:  # a mean over the window, as the main screen's headline
            self._tp.append((t, v))
            while self._tp and t - self._tp[0][0] > self.window_s:
                self._tp.popleft()
            v = sum(x for _, x in self._tp) / len(self._tp)
        self.tok_s.add(self.step, t, v)
        return True
