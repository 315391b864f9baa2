"""The trackers never stand in training's way (trainer/tracking/dispatcher.py), with the real MetricsWriter and
the real trackers: one that cannot even import is off and said once while the others get every record; one
that hangs never blocks a write (its records are dropped and counted) nor the end of the run."""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from tests.support import faults
from trainer.run.rundir import MetricsWriter
from trainer.tracking import dispatcher
from trainer.tracking.base import Context
from trainer.tracking.dispatcher import CAPACITY, Tracking
from trainer.tracking.state import State

pytest.importorskip("tensorboard")


def _tracking(tmp_path, names, lines):
    writer = MetricsWriter(str(tmp_path / "metrics.jsonl"))
    ctx = Context(str(tmp_path), {"lr": 0.1}, state=State(str(tmp_path)), log=lines.append)
    return writer, Tracking(names, ctx, writer)


def _records(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]


def _scalars(log_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ea = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    ea.Reload()
    return [(s.step, s.value) for s in ea.Scalars(tag)] if tag in ea.Tags()["scalars"] else []


def _wait(pred, what, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"no {what} in {timeout:.0f} s")


def test_a_tracker_that_cannot_import_is_off_and_said_once(tmp_path, monkeypatch):
    # `import mlflow...` raises ImportError, as when it is not installed (its modules may be loaded already)
    for mod in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")] or ["mlflow"]:
        monkeypatch.setitem(sys.modules, mod, None)
    lines: list[str] = []
    writer, tracking = _tracking(tmp_path, ("tensorboard", "mlflow"), lines)
    for i in range(1, 21):
        writer.write("step", step=i, loss=1.0 / i)
    _wait(lambda: any(r.get("name") == "tracker_failed" for r in _records(tmp_path)), "tracker_failed event")
    writer.event("stopped", reason="finished", exit_code=0)
    tracking.close()
    writer.close()

    failed = [x for x in lines if "failed and is off" in x]
    assert len(failed) == 1 and "tracking: mlflow" in failed[0], lines
    assert "ModuleNotFoundError" in failed[0] and "pip install '.[mlflow]'" in failed[0]
    ev = [r for r in _records(tmp_path) if r.get("name") == "tracker_failed"]
    assert len(ev) == 1 and ev[0]["tracker"] == "mlflow" and "ModuleNotFoundError" in ev[0]["message"]
    assert _records(tmp_path)[-1]["name"] == "stopped"  # nothing after `stopped`
    got = _scalars(tmp_path / "tensorboard", "train/loss")
    assert [s for s, _ in got] == list(range(1, 21))
    assert [v for _, v in got] == pytest.approx([1.0 / i for i in range(1, 21)])


def test_a_hung_tracker_never_blocks_a_write_nor_the_end(tmp_path, monkeypatch):
    faults.patch_trackers(
        dispatcher, {}, {"tensorboard"}, monkeypatch.setattr
    )  # it takes nothing until released
    lines: list[str] = []
    writer, tracking = _tracking(tmp_path, ("tensorboard",), lines)
    worker = tracking.workers[0]
    extra = 50
    for i in range(CAPACITY + extra):  # every write returns although the tracker takes none
        writer.write("throughput", devices=[{"role": "drafter", "tok_s": float(i)}], queue={"depth": 1})
    assert worker.dropped == extra
    assert sum("tensorboard is behind" in x for x in lines) == 1  # said once per streak
    writer.event("stopped", reason="finished", exit_code=0)
    tracking.close(timeout=0.2)  # the end of the run does not wait for it either
    assert any("tensorboard did not finish within 0.2 s" in x for x in lines), lines
    assert any(f"{extra + 1} record(s) dropped" in x for x in lines), (
        lines
    )  # `stopped` too: the queue is full

    worker.__dict__.setdefault(
        "hang_release", threading.Event()
    ).set()  # let it go: it logs what it had queued, the dropped records are not there
    worker.finish(time.monotonic() + 60)
    worker.thread.join(60)
    writer.close()
    assert not worker.thread.is_alive()
    got = _scalars(tmp_path / "tensorboard", "throughput/tok_s/drafter")
    assert [v for _, v in got] == [float(i) for i in range(CAPACITY)]
