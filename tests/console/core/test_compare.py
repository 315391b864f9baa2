"""The compare view's headless data (console/core/compare.py, compare_series.py): capped, evenly
decimated series per run, restarts, the same tok/s as the main screen, smoothing, thinning, x by
step or time, the shared x range, the run choice and cleaned labels."""

from __future__ import annotations

import math
import statistics

import pytest

from console.core.compare import (
    CompareData,
    CompareView,
    ema,
    figures,
    latest,
    run_label,
    thin,
    time_unit,
    xy,
)
from console.core.compare_series import RunSeries, Series
from console.core.events import ConnState, Record
from console.core.state import ConsoleState
from tests.support.records import T0, dev, tp


def step(t: float, s: int, loss: float, est: float | None = None) -> dict:
    rec = {"t": t, "kind": "step", "step": s, "total_steps": 10_000, "loss": loss}
    if est is not None:
        rec["accept_len_est"] = est
    return rec


def test_a_series_keeps_at_most_cap_points_spread_evenly_over_the_whole_run():
    s = Series(cap=100)
    for i in range(100_000):
        s.add(i, T0 + i, float(i))
    pts = s.points()
    assert len(pts) <= 100
    steps = [p[0] for p in pts]
    assert steps[0] == 0 and steps[-1] == 99_999  # the start and the newest point are both there
    gaps = {b - a for a, b in zip(steps[:-2], steps[1:-1], strict=False)}
    assert len(gaps) == 1  # evenly spread (the newest point is added on its own)
    assert steps[-2] > 99_999 - 2 * gaps.pop()  # and the decimated part reaches the end


def test_a_series_refuses_a_cap_too_small():
    with pytest.raises(ValueError, match="at least 4"):
        Series(cap=2)


def test_a_restart_from_an_older_checkpoint_drops_the_abandoned_steps():
    r = RunSeries()
    for s in range(1, 101):
        r.apply(step(T0 + s, s, 1.0, est=2.0))
    r.apply({"t": T0 + 60, "kind": "eval", "step": 60, "accept_len": 2.5})
    r.apply({"t": T0 + 90, "kind": "eval", "step": 90, "accept_len": 2.7})
    r.apply(step(T0 + 200, 61, 0.5))  # resumed from step 60's checkpoint
    steps = [p[0] for p in r.loss.points()]
    assert steps == [*range(1, 61), 61] and r.loss.last[2] == 0.5
    assert [p[0] for p in r.accept_eval.points()] == [60]  # the eval of the kept checkpoint stays
    assert max(p[0] for p in r.accept_est.points()) == 60


def test_bad_values_and_unknown_records_are_skipped():
    r = RunSeries()
    v0 = r.version
    for rec in (
        {"t": T0, "kind": "step", "step": True, "loss": 1.0},  # a bool is no step
        {"t": T0, "kind": "step", "step": -3, "loss": 1.0},
        {"t": T0, "kind": "eval", "step": 5, "accept_len": float("nan")},
        {"t": T0, "kind": "throughput", "devices": "many"},
        {"t": T0, "kind": "mystery", "step": 5},
    ):
        r.apply(rec)
    assert r.version == v0 and r.t0 is None
    r.apply({"t": None, "kind": "step", "step": 4, "loss": float("inf"), "accept_len_est": 1.5})
    assert len(r.loss) == 0 and r.accept_est.points() == [(4, None, 1.5)] and r.step == 4


def test_tok_s_is_the_main_screens_headline_from_the_same_records():
    """Drafters' sum as a 10 s mean, as ConsoleState computes it: a CPU trainer's windows jump between
    0 and a burst, the curve does not."""
    r, st = RunSeries(), ConsoleState(clock=lambda: T0 + 100)
    for i in range(40):
        rec = tp(T0 + 0.5 * i, [dev(0, "target", 900.0), dev(1, "drafter", 2000.0 if i % 2 else 0.0)])
        r.apply(rec)
        st.apply(Record(rec))
        assert r.tok_s.last[2] == pytest.approx(st.tok_s)
    assert r.tok_s.last[2] == pytest.approx(1000.0, rel=0.06)  # not 0, not 2000
    assert r.tok_s.last[0] is None  # no step yet: not on a by-step graph
    for i in range(5000):  # a clock running backwards never grows the window without bound
        r.apply(tp(T0 - i, [dev(1, "drafter", 10.0)]))
    assert len(r._tp) <= 512 and len(r.tok_s) <= r.cap


def test_ema_is_tensorboards_debiased_smoothing():
    ys = [1.0, 3.0, 2.0, 5.0]
    assert ema(ys, 0.0) == ys
    w, s, out = 0.6, 0.0, []
    for n, y in enumerate(ys, 1):
        s = w * s + (1 - w) * y
        out.append(s / (1 - w**n))
    assert ema(ys, 0.6) == pytest.approx(out)
    assert ema([4.0] * 5, 0.9) == pytest.approx([4.0] * 5)  # no pull towards 0 at the start
    noisy = [math.sin(i) for i in range(500)]  # a step-to-step wobble around 0
    assert statistics.pstdev(ema(noisy, 0.9)[50:]) < statistics.pstdev(noisy[50:]) / 4


def test_thinning_bounds_the_points_and_keeps_a_spike():
    xs = [float(i) for i in range(10_000)]
    ys = [1.0] * 10_000
    ys[7_777] = 50.0
    ys[1_234] = -9.0
    tx, ty = thin(xs, ys, 100)
    assert len(tx) <= 200 and 50.0 in ty and -9.0 in ty
    assert tx == sorted(tx) and tx[0] == 0.0
    assert thin(xs[:50], ys[:50], 100) == (xs[:50], ys[:50])  # few points: as they are


def test_x_by_step_takes_the_last_value_of_a_step_and_by_time_the_seconds_since_t0():
    pts = [(None, T0, 5.0), (1, T0 + 1, 1.0), (1, T0 + 1.5, 2.0), (2, T0 + 2, 3.0), (3, None, 4.0)]
    assert xy(pts, "step", T0) == ([1.0, 2.0, 3.0], [2.0, 3.0, 4.0])
    assert xy(pts, "time", T0) == ([0.0, 1.0, 1.5, 2.0], [5.0, 1.0, 2.0, 3.0])
    assert time_unit(300) == (1.0, "s") and time_unit(1200) == (60.0, "min") and time_unit(4 * 3600)[1] == "h"


def two_runs() -> CompareData:
    data = CompareData(3)
    for s in range(1, 301):  # run 0: 300 steps, a step a second; run 1: 600 steps, two a second, later
        data.apply(0, Record(step(T0 + s, s, 3.0 / s, est=1 + s / 300)))
    for s in range(1, 601):
        data.apply(1, Record(step(T0 + 5000 + s / 2, s, 2.0 / s, est=1 + s / 600)))
    data.apply(1, Record({"t": T0 + 5300, "kind": "eval", "step": 600, "accept_len": 2.2}))
    data.apply(1, ConnState("connected"))  # not a record: ignored
    data.apply(7, Record(step(T0, 1, 1.0)))  # no such run: ignored
    return data


def test_figures_share_one_x_range_by_step_and_by_time():
    data = two_runs()
    view = CompareView(3)
    figs = figures(data, view, bins=50)
    assert figs.xlim == (1.0, 600.0) and figs.xlabel == "step"
    loss = {ln.run: ln for ln in figs.lines["loss"]}
    assert set(loss) == {0, 1} and len(loss[1].xs) <= 100  # run 2 has no data: no line
    accept = figs.lines["accept"]
    assert [(ln.run, ln.points) for ln in accept] == [(0, False), (1, False), (1, True)]
    view.toggle_x()
    figs = figures(data, view, bins=50)
    # by time both start at 0 (each run's first record), though run 1 started 5,000 s later
    assert figs.xlim == (0.0, 299.5) and figs.xlabel == "s since the run's first record"
    assert {ln.run: ln.xs[0] for ln in figs.lines["loss"]} == {0: 0.0, 1: 0.0}


def test_smoothing_applies_to_lines_not_to_the_measured_points():
    data = two_runs()
    data.apply(1, Record({"t": T0 + 5400, "kind": "eval", "step": 601, "accept_len": 9.0}))
    view = CompareView(3, {1})
    view.cycle_smoothing()
    view.cycle_smoothing()
    assert view.weight == 0.9
    figs = figures(data, view)
    measured = next(ln for ln in figs.lines["accept"] if ln.points)
    assert measured.ys == [2.2, 9.0]
    raw = [p[2] for p in data.runs[1].loss.points()]
    assert figs.lines["loss"][0].ys[-1] > raw[-1]  # the falling loss, smoothed, lags behind
    view.cycle_smoothing()
    assert view.weight == 0.0


def test_the_choice_of_runs():
    assert CompareView(3, {5, -1}).chosen == {0, 1, 2}  # nothing valid: all
    v = CompareView(3, {0, 2})
    v.toggle_run(2)
    assert v.chosen == {0}
    v.toggle_run(0)  # the last one shown stays
    assert v.chosen == {0}
    v.toggle_run(9)
    v.toggle_run(1)
    assert v.chosen == {0, 1}
    v.show_all()
    assert v.chosen == {0, 1, 2}
    data = two_runs()
    assert {ln.run for ln in figures(data, CompareView(3, {1})).lines["loss"]} == {1}


def test_version_moves_with_data_and_a_reset_forgets():
    data = two_runs()
    v = data.version
    data.apply(0, Record(step(T0 + 400, 301, 0.01)))
    assert data.version != v and latest(data.runs[0]).step == 301
    data.reset()
    assert latest(data.runs[0]).step is None and figures(data, CompareView(3)).xlim is None


def test_labels_are_cleaned_one_line_and_elided():
    assert run_label("a\x1b]52;c;ZXZpbA==\x07b\nc") == "a\ufffdb c"
    assert run_label("\x1b[31mred\x1b[0m") == "red"
    long = run_label("x" * 100)
    assert len(long) == 28 and long.endswith("…")
