"""One naming for every tracker (trainer/tracking/records.py), checked on a recorded run's own records."""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainer.tracking.records import MAX_LIST, Points, name

RUN = Path(__file__).resolve().parents[2] / "data" / "tiny_run" / "metrics.jsonl"


def _recs() -> list[dict]:
    return [json.loads(line) for line in RUN.read_text().splitlines()]


def test_steps_throughput_and_events_of_a_recorded_run():
    points = Points()
    out = [(r, points.convert(r)) for r in _recs()]
    steps = [(r, p) for r, p in out if r["kind"] == "step"]
    assert steps
    for r, p in steps:
        assert p.step == r["step"] == p.now
        assert p.scalars["train/loss"] == r["loss"] and p.scalars["train/lr"] == r["lr"]
        assert [p.scalars[f"train/acc/{k:02d}"] for k in range(1, len(r["acc"]) + 1)] == r["acc"]
        assert p.scalars["train/noise"] == r["noise"]
    last_step = 0
    for r, p in out:
        if r["kind"] == "step":
            last_step = r["step"]
        if r["kind"] == "throughput":
            drafters = [d["tok_s"] for d in r["devices"] if d["role"] == "drafter"]
            assert p.scalars["throughput/tok_s/drafter"] == sum(drafters)  # the headline: drafters only
            assert p.scalars["queue/depth"] == r["queue"]["depth"]
            assert p.step == last_step  # throughput carries no step: the current one
    stopped = [p for r, p in out if r.get("name") == "stopped"]
    assert stopped[0].event == "stopped" and '"reason": "signal"' in stopped[0].text
    assert stopped[0].scalars == {"event/stopped/exit_code": 0.0}
    assert points.status == "killed"


def test_eval_records_carry_their_step_and_the_estimate_error():
    points = Points()
    points.convert({"t": 1.0, "kind": "step", "step": 40, "loss": 1.0, "accept_len_est": 3.5})
    points.convert({"t": 2.0, "kind": "step", "step": 41, "loss": 1.0, "accept_len_est": 3.6})
    p = points.convert(
        {
            "t": 3.0,
            "kind": "eval",
            "step": 40,
            "accept_len": 3.0,
            "accept_len_se": 0.2,
            "per_position": [0.9, 0.5],
            "checkpoint": "/r/checkpoints/step_00000040",
        }  # fmt: skip
    )
    assert (p.step, p.now) == (40, 41)
    assert p.scalars["eval/accept_len"] == 3.0 and p.scalars["eval/accept_len_se"] == 0.2
    assert p.scalars["eval/accept_len_est"] == 3.5 and p.scalars["eval/accept_len_est_error"] == 0.5
    assert p.scalars["eval/per_position/02"] == 0.5
    assert p.labels == {"eval/checkpoint": "/r/checkpoints/step_00000040"}


def test_labels_only_when_they_change_and_hostile_records_stay_bounded():
    points = Points()
    a = points.convert({"t": 1, "kind": "step", "step": 1, "accept_len_est_vs": "target"})
    b = points.convert({"t": 2, "kind": "step", "step": 2, "accept_len_est_vs": "target"})
    assert a.labels == {"train/accept_len_est_vs": "target"} and b.labels == {}
    assert points.convert({"kind": 3}) is None and points.convert({"t": 1}) is None
    p = points.convert(
        {"t": "x", "kind": "we:ird\x1b[2J", "step": True, "big": list(range(10_000)), "n": float("nan")}
    )
    assert len(p.scalars) == MAX_LIST  # a list gives at most MAX_LIST scalars; NaN none
    assert all(re.fullmatch(r"we_ird__2J/big/\d\d", k) for k in p.scalars), list(p.scalars)[:3]
    assert name("tok_s/cuda:0 é") == "tok_s/cuda_0 _"  # MLflow's metric-name alphabet
    assert p.step == 2 and p.t == 0.0  # a bool is no step; a bad time is 0
