"""metrics.jsonl records as tracker points: the one naming that every tracker and ``python -m trainer.report``
use (docs/trainer.md "Experiment tracking").

``Points.convert(record)`` takes the records in order and keeps what a record alone does not say: the current
training step (throughput and most events carry none), the acceptance estimate per step (an ``eval`` record's
error is estimate minus measured) and the string values seen (a label is passed on only when it changes).
Pure Python, bounded: at most ``MAX_LIST`` entries of a list, ``MAX_SCALARS`` scalars a record, names cut to
``MAX_NAME`` characters and reduced to the characters every tracker accepts.
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

MAX_LIST = 64
MAX_SCALARS = 512
MAX_NAME = 200
MAX_TEXT = 1000
MAX_LABELS = 256
_EST_KEPT = 4096  # steps whose accept_len_est is kept for the eval records' error
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-./ ]")  # MLflow's metric-name alphabet (TensorBoard, W&B take it too)
_AXIS = frozenset({"t", "kind", "step"})


@dataclass
class Point:
    """One record for a tracker. ``step``: the record's own step where it has one (step, eval, events with
    ``step``), else the current training step; ``now``: the current training step (never lower than an earlier
    point's within one process: W&B's step); ``t``: its wall time (unix seconds)."""

    kind: str
    step: int
    now: int
    t: float
    scalars: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)  # string values, only when they changed
    event: str | None = None  # an event's name
    text: str | None = None  # an event as one line: "name {fields as JSON}"


def name(text: Any) -> str:
    """A metric-name part: characters outside ``[A-Za-z0-9_-./ ]`` become ``_``; cut to ``MAX_NAME``."""
    return _BAD_CHARS.sub("_", str(text))[:MAX_NAME] or "_"


def number(v: Any) -> float | None:
    """A finite int or float (not a bool) as float, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def status_of(reason: Any) -> str:
    """A ``stopped`` event's reason as a run status: finished, killed (a stop signal: resumable) or failed."""
    if reason == "finished":
        return "finished"
    return "killed" if reason == "signal" else "failed"


class Points:
    def __init__(self) -> None:
        self.step = 0
        self.status: str | None = None  # from the last ``stopped`` event
        self._est: OrderedDict[int, float] = OrderedDict()
        self._labels: dict[str, str] = {}

    def convert(self, rec: dict[str, Any]) -> Point | None:
        kind = rec.get("kind")
        if not isinstance(kind, str):
            return None
        t = number(rec.get("t"))
        own = _int(rec.get("step"))
        if kind == "step" and own is not None:
            self.step = own
        p = Point(kind=kind, step=self.step if own is None else own, now=self.step, t=t or 0.0)
        if kind == "throughput":
            self._throughput(rec, p)
        elif kind == "event":
            self._event(rec, p)
        elif kind == "startup":
            self._flatten(f"startup/{name(rec.get('phase'))}", rec, p, skip={"phase", "rank"})
        else:
            self._flatten("train" if kind == "step" else name(kind), rec, p)
        if kind == "step":
            self._keep_estimate(p)
        elif kind == "eval":
            self._eval_error(p)
        p.scalars = dict(list(p.scalars.items())[:MAX_SCALARS])
        return p

    def _flatten(self, prefix: str, rec: dict, p: Point, skip: frozenset | set = frozenset()) -> None:
        for k, v in rec.items():
            if k in _AXIS or k in skip:
                continue
            key = f"{prefix}/{name(k)}"
            if number(v) is not None:
                p.scalars[key] = number(v)
            elif isinstance(v, list):
                for i, x in enumerate(v[:MAX_LIST]):
                    if number(x) is not None:
                        p.scalars[f"{key}/{i + 1:02d}"] = number(x)
            elif isinstance(v, str):
                self._label(key, v, p)

    def _label(self, key: str, value: str, p: Point) -> None:
        value = value[:MAX_TEXT]
        if self._labels.get(key) == value or (key not in self._labels and len(self._labels) >= MAX_LABELS):
            return
        self._labels[key] = value
        p.labels[key] = value

    def _throughput(self, rec: dict, p: Point) -> None:
        devices = rec.get("devices") if isinstance(rec.get("devices"), list) else []
        seen: dict[str, int] = {}
        for d in devices[:MAX_LIST]:
            if not isinstance(d, dict):
                continue
            role = name(d.get("role"))
            i = seen[role] = seen.get(role, -1) + 1
            tok_s, busy = number(d.get("tok_s")), number(d.get("busy"))
            if tok_s is not None:
                total = f"throughput/tok_s/{role}"  # the role's sum: the run's headline is the drafters'
                p.scalars[total] = p.scalars.get(total, 0.0) + tok_s
                p.scalars[f"throughput/tok_s/{role}{i}"] = tok_s
            if busy is not None:
                p.scalars[f"throughput/busy/{role}{i}"] = busy
        queue = rec.get("queue") if isinstance(rec.get("queue"), dict) else {}
        for k in ("depth", "capacity"):
            if number(queue.get(k)) is not None:
                p.scalars[f"queue/{k}"] = number(queue[k])

    def _event(self, rec: dict, p: Point) -> None:
        ev = name(rec.get("name"))[:64]
        p.event = ev
        rest = {k: v for k, v in rec.items() if k not in ("t", "kind", "name")}
        for k, v in rest.items():
            if k not in ("step", "pid") and number(v) is not None:
                p.scalars[f"event/{ev}/{name(k)}"] = number(v)
        p.text = f"{ev} {json.dumps(rest, sort_keys=True, default=str)}"[:MAX_TEXT]
        if ev == "started" and _int(rec.get("step")) is not None:
            self.step = p.now = rec["step"]
        if ev == "stopped":
            self.status = status_of(rec.get("reason"))

    def _keep_estimate(self, p: Point) -> None:
        est = p.scalars.get("train/accept_len_est")
        if est is None:
            return
        self._est[p.step] = est
        self._est.move_to_end(p.step)
        while len(self._est) > _EST_KEPT:
            self._est.popitem(last=False)

    def _eval_error(self, p: Point) -> None:
        est, measured = self._est.get(p.step), p.scalars.get("eval/accept_len")
        if est is not None and measured is not None:
            p.scalars["eval/accept_len_est"] = est
            p.scalars["eval/accept_len_est_error"] = est - measured
