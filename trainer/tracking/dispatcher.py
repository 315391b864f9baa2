"""``--report-to``: every metrics.jsonl record teed to the trackers, never in the way of training.

``start(...)`` (trainer/pipeline.py, the process that owns metrics.jsonl: the single process or the launcher, so
rank 0 only) listens to the ``MetricsWriter`` (``writer.listeners``: each record once written, of every kind,
from every thread) and hands each record to one worker thread per tracker through a bounded queue. The
writer's thread only enqueues (``put_nowait``); a full queue (a tracker slower than the records) drops the
record and counts it: said once per streak in train.log, the total at the end. Each worker imports its library,
opens its run (W&B and MLflow take a second or more), converts records to points (trainer/tracking/records.py)
and logs them in batches.

A tracker that raises (its library absent, a bad setting, a full disk, a server that refuses) is off from then
on: said once in train.log (``warning: tracking: NAME failed and is off ...; training goes on``) and, while the
run goes on, as a ``tracker_failed`` event (``tracker``, ``message``); training never waits for it.

``close()`` after the ``stopped`` event: each worker logs what is queued and closes its run (its status from
``stopped``), within ``CLOSE_S`` seconds in all; a tracker still busy then is left behind (a daemon thread) and said.

``Worker._check(when)`` is called before a tracker opens, before each batch and before it closes: a no-op, a seam
where tests make a tracker fail or hang (tests/support/faults.py).
"""

from __future__ import annotations

import importlib
import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from trainer.thread_names import named
from trainer.tracking.base import Context, Tracker
from trainer.tracking.records import Points
from trainer.tracking.state import State

CAPACITY = 4096  # records queued per tracker
BATCH = 256
CLOSE_S = 30.0
MAX_MESSAGE = 500
_END = object()
MODULES = {
    "tensorboard": ("trainer.tracking.tensorboard_tracker", "TensorBoard"),
    "wandb": ("trainer.tracking.wandb_tracker", "WandB"),
    "mlflow": ("trainer.tracking.mlflow_tracker", "MLflow"),
}


def make(name: str) -> Tracker:
    module, cls = MODULES[name]
    return getattr(importlib.import_module(module), cls)()


def message(e: BaseException) -> str:
    """An exception as one bounded line."""
    return " ".join(f"{type(e).__name__}: {e}".split())[:MAX_MESSAGE]


class Worker:
    """One tracker's queue and thread."""

    def __init__(self, name: str, ctx: Context, on_fail: Callable[[str, BaseException], None]):
        self.name, self.ctx, self.on_fail = name, ctx, on_fail
        self.q: queue.Queue = queue.Queue(CAPACITY)
        self.dropped = 0
        self.failed = False
        self._lock = threading.Lock()
        self._streak = False
        self.tracker = make(name)  # the module only: its library is imported when it opens, in the thread
        self.tracker.prepare()  # environment defaults now, before any thread or process could read them
        self.thread = threading.Thread(target=named(self._run), name=f"dflash-tracking-{name}", daemon=True)

    def offer(self, rec: Any) -> None:
        if self.failed:
            return
        try:
            self.q.put_nowait(rec)
            self._streak = False
        except queue.Full:
            with self._lock:
                self.dropped += 1
                first, self._streak = not self._streak, True
            if first:
                self.ctx.log(
                    f"warning: tracking: {self.name} is behind: records are dropped (and counted) until it "
                    "catches up; training goes on"
                )

    def finish(self, deadline: float) -> None:
        """Queue the end (waiting for room until ``deadline``)."""
        if self.failed or not self.thread.is_alive():
            return
        try:
            self.q.put(_END, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass

    def _check(self, when: str) -> None:
        """Before ``open``, each batch (``"1"``, ``"2"``...) and ``close``: a seam for tests; does nothing."""

    def _run(self) -> None:
        tracker = None
        try:
            self._check("open")
            tracker = self.tracker
            tracker.open(self.ctx)
            self.ctx.log(f"tracking: {self.name}: {tracker.where}")
            points = self._loop(tracker)
            self._check("close")
            tracker.close(points.status)
        except Exception as e:  # noqa: BLE001 - any failure of a tracker turns it off, never the run
            self.failed = True
            self.on_fail(self.name, e)
            self._abandon(tracker)

    def _loop(self, tracker: Tracker) -> Points:
        points, n = Points(), 0
        while True:
            batch = [self.q.get()]
            while len(batch) < BATCH and batch[-1] is not _END:
                try:
                    batch.append(self.q.get_nowait())
                except queue.Empty:
                    break
            end = batch[-1] is _END
            recs = batch[:-1] if end else batch
            if recs:
                n += 1
                self._check(str(n))
                tracker.log([p for p in map(points.convert, recs) if p is not None])
            if end:
                return points

    def _abandon(self, tracker: Tracker | None) -> None:
        while True:  # what was queued goes (the writer no longer offers anything)
            try:
                self.q.get_nowait()
            except queue.Empty:
                break
        if tracker is not None:
            try:
                tracker.close("failed")
            except Exception:  # noqa: BLE001, S110 - already said; closing is a courtesy
                pass


class Tracking:
    """The trackers of one run; with none, nothing listens and nothing runs."""

    def __init__(self, names: tuple[str, ...], ctx: Context | None, writer):
        self.writer, self.ctx = writer, ctx
        self.closing = False
        self.workers = [Worker(n, ctx, self._failed) for n in names] if ctx is not None else []
        if self.workers:
            writer.listeners.append(self.listen)
            for w in self.workers:
                w.thread.start()

    def listen(self, rec: dict) -> None:
        """The writer's listener: enqueue only; never raises into the thread that wrote the record."""
        for w in self.workers:
            try:
                w.offer(rec)
            except Exception:  # noqa: BLE001, S110 - a listener must not break a training thread
                pass

    def _failed(self, name: str, e: BaseException) -> None:
        msg = message(e) + (f" (pip install '.[{name}]')" if isinstance(e, ImportError) else "")
        self.ctx.log(
            f"warning: tracking: {name} failed and is off for the rest of the run: {msg}; training goes on"
        )
        if not self.closing:  # after `stopped` nothing more goes into metrics.jsonl
            self.writer.event("tracker_failed", tracker=name, message=msg)

    def close(self, timeout: float = CLOSE_S) -> None:
        if not self.workers:
            return
        self.closing = True
        deadline = time.monotonic() + timeout
        for w in self.workers:
            w.finish(deadline)
        for w in self.workers:
            w.thread.join(max(0.0, deadline - time.monotonic()))
            if w.thread.is_alive():
                self.ctx.log(f"warning: tracking: {w.name} did not finish within {timeout:g} s; left behind")
            if w.dropped:
                self.ctx.log(f"tracking: {w.name}: {w.dropped} record(s) dropped (its queue was full)")
        if self.listen in self.writer.listeners:
            self.writer.listeners.remove(self.listen)


def start(
    settings, run_dir: str, writer, *, resumed: bool, log: Callable[[str], None], version: str
) -> Tracking:
    """The run's trackers (``settings.report_to``), listening to ``writer`` from now on."""
    names = tuple(getattr(settings, "report_to", ()) or ())
    if not names:
        return Tracking((), None, writer)
    state = State(run_dir)
    if state.problem:
        log(f"warning: tracking: {state.problem}; each tracker starts a new run")
    hp = json.loads(settings.to_json())
    hp["trainer_version"] = version
    log(f"tracking: {', '.join(names)} (in the background; docs/trainer.md 'Experiment tracking')")
    return Tracking(names, Context(run_dir, hp, resumed=resumed, state=state, log=log), writer)
