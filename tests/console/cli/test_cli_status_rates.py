"""``status``'s tok/s is the screen's figure: the drafters' sum as a mean over the last 10 s of records (a
slow step's throughput records alternate 0 and a burst; the newest alone said 0), and a run that is not
running says its figure is the last known one, and how old."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.core_util import cli, conn_args
from tests.support.devhost import devhost_fixture

pytestmark = pytest.mark.e2e
host = devhost_fixture(scope="module")


def throughput(t: float, tok_s: float) -> dict:
    devices = [
        {"role": "target", "device": "cpu", "tok_s": 900.0},
        {"role": "drafter", "device": "cpu", "tok_s": tok_s},
    ]
    return {"t": t, "kind": "throughput", "devices": devices, "queue": {"depth": 4, "capacity": 8}}


def test_status_gives_the_ten_second_mean_and_says_when_it_is_last_known(host, tmp_path):
    t0 = time.time() - 300
    recs = [throughput(t0 - 60, 9999.0)]  # older than the window: not in the mean
    recs += [throughput(t0 + i, 0.0 if i % 2 else 800.0) for i in range(10)]  # the newest one says 0
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    r = cli("status", *conn_args(host, ct=None), "--run-dir", str(tmp_path))
    assert r.returncode == 4, r.stdout + r.stderr  # no trainer runs
    assert "tok/s 400 (drafters, 10 s mean; last known, 5 min ago)  queue 4/8" in r.stdout, r.stdout
    st = json.loads(cli("status", *conn_args(host, ct=None), "--run-dir", str(tmp_path), "--json").stdout)
    assert st["tok_s"] == 400.0
