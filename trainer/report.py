"""``python -m trainer.report RUN_DIR --to tensorboard|mlflow``: a run's metrics.jsonl exported into a tracker.

For runs trained without ``--report-to`` (also runs trained before it existed): every record, named as the
live trackers name them (trainer/tracking/records.py), and the run's settings from run.json (its ``argv`` as
flags, ``drafter``, ``version``, ``roles``). docs/trainer.md "Experiment tracking".

- ``tensorboard``: event files in ``--logdir`` (default RUN_DIR/tensorboard); refused when that folder already
  holds event files (the run's own ``--report-to tensorboard`` or an earlier export: the curves would double);
- ``mlflow``: a new run (tag ``dflash.source=export``) in ``MLFLOW_TRACKING_URI``, else the file store
  RUN_DIR/mlruns; experiment ``MLFLOW_EXPERIMENT_NAME``, else ``dflash``.

Reading is bounded and distrustful: metrics.jsonl must be a regular file (a symlink is not followed); a line
over 1 MiB, or one that is not a JSON object with a string ``kind`` (a torn last line), is skipped and counted;
run.json over 1 MiB or unreadable gives no settings.

Exit status: 0 exported; 1 the tracker failed while writing (what it wrote stays); 2 bad arguments, no
readable metrics.jsonl, a --logdir that already holds event files; 3 the tracker's library is not installed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import stat
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any, BinaryIO

from trainer.tracking.base import Context, Tracker
from trainer.tracking.dispatcher import message
from trainer.tracking.mlflow_tracker import MLflow
from trainer.tracking.records import Points
from trainer.tracking.tensorboard_tracker import LOG_DIR, TensorBoard

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_MISSING = 0, 1, 2, 3
MAX_LINE = 1 << 20
MAX_RUN_JSON = 1 << 20
MAX_FLAGS = 500
BATCH = 500
LIBRARIES = {"tensorboard": "tensorboard", "mlflow": "mlflow"}  # --to -> import name (the extra's name too)


class ReportError(Exception):
    def __init__(self, code: int, text: str):
        super().__init__(text)
        self.code = code


class Reading:
    """Counts of what was read: records by kind, lines skipped."""

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.skipped = 0

    def summary(self) -> str:
        return ", ".join(f"{k}: {n}" for k, n in sorted(self.kinds.items())) or "none"


def open_regular(path: str, what: str) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (not through a symlink), else ReportError (exit 2)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise ReportError(EXIT_USAGE, f"cannot open {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ReportError(EXIT_USAGE, f"{what} {path} is not a regular file")
    return os.fdopen(fd, "rb")


def parse(line: bytes) -> dict | None:
    try:
        rec = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("kind"), str) else None


def records(f: BinaryIO, reading: Reading) -> Iterator[dict]:
    """The file's records; lines too long or malformed are skipped and counted (blank lines are not counted)."""
    while line := f.readline(MAX_LINE + 1):
        if len(line) > MAX_LINE:
            while line and not line.endswith(b"\n"):  # the rest of the long line, never held whole
                line = f.readline(MAX_LINE + 1)
            reading.skipped += 1
            continue
        if not line.strip():
            continue
        rec = parse(line)
        if rec is None:
            reading.skipped += 1
            continue
        reading.kinds[rec["kind"]] += 1
        yield rec


def flags_of(argv: Any) -> dict[str, Any]:
    """``["--lr", "1e-2", "--use-soft-labels"]`` -> ``{"lr": "1e-2", "use_soft_labels": True}`` (bounded)."""
    out: dict[str, Any] = {}
    items = [str(x)[:1000] for x in argv[: 2 * MAX_FLAGS]] if isinstance(argv, list) else []
    for i, a in enumerate(items):
        if a.startswith("--") and len(a) > 2:
            nxt = items[i + 1] if i + 1 < len(items) else None
            out[a[2:].replace("-", "_")] = True if nxt is None or nxt.startswith("--") else nxt
    return out


def settings_of(run_dir: str) -> dict[str, Any]:
    """The run's settings from run.json (empty where it is missing or unreadable)."""
    try:
        with open_regular(os.path.join(run_dir, "run.json"), "run.json") as f:
            info = json.loads(f.read(MAX_RUN_JSON + 1)[:MAX_RUN_JSON])
    except (ReportError, ValueError, RecursionError, OSError):
        return {}
    if not isinstance(info, dict):
        return {}
    out = flags_of(info.get("argv"))
    drafter = info.get("drafter") if isinstance(info.get("drafter"), dict) else {}
    out.update({f"drafter.{k}": v for k, v in list(drafter.items())[:MAX_FLAGS]})
    for k in ("version", "hostname"):
        if isinstance(info.get(k), str):
            out[k] = info[k][:1000]
    if isinstance(info.get("roles"), dict):
        out["roles"] = json.dumps(info["roles"])[:1000]
    return out


def tracker_for(to: str, run_dir: str, logdir: str | None) -> Tracker:
    try:
        importlib.import_module(LIBRARIES[to])
    except ImportError as e:
        raise ReportError(
            EXIT_MISSING, f"--to {to}: cannot import {LIBRARIES[to]} ({e}); pip install '.[{to}]'"
        ) from None
    if to == "mlflow":
        return MLflow()
    where = os.path.abspath(logdir or os.path.join(run_dir, LOG_DIR))
    if os.path.isdir(where) and any(n.startswith("events.out.tfevents") for n in os.listdir(where)):
        raise ReportError(
            EXIT_USAGE,
            f"{where} already holds event files (the run's own --report-to tensorboard, or an earlier "
            "export): give another --logdir",
        )
    return TensorBoard(
        where if logdir else None
    )  # None: RUN/tensorboard, made and checked as the trainer does


def export(run_dir: str, tracker: Tracker, reading: Reading) -> None:
    """Every record of RUN_DIR/metrics.jsonl into ``tracker`` (opened and closed here)."""
    with open_regular(os.path.join(run_dir, "metrics.jsonl"), "metrics.jsonl") as f:
        ctx = Context(run_dir, settings_of(run_dir), notes={"dflash.source": "export"}, log=_say)
        tracker.prepare()
        tracker.open(ctx)
        points, batch = Points(), []
        for rec in records(f, reading):
            p = points.convert(rec)
            if p is not None:
                batch.append(p)
            if len(batch) >= BATCH:
                tracker.log(batch)
                batch = []
        if batch:
            tracker.log(batch)
        tracker.close(points.status or "killed")  # no `stopped`: the run was killed (or still runs)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m trainer.report",
        description="Export a run's metrics.jsonl (and run.json's settings) into TensorBoard or MLflow.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (docs/run-directory.md)")
    p.add_argument("--to", required=True, choices=tuple(LIBRARIES), help="the tracker to export into")
    p.add_argument("--logdir", default=None, help=f"tensorboard: the event files' folder (RUN_DIR/{LOG_DIR})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 on bad arguments
    reading = Reading()
    try:
        if not os.path.isdir(args.run_dir):
            raise ReportError(EXIT_USAGE, f"RUN_DIR: {args.run_dir} is not a directory")
        tracker = tracker_for(args.to, args.run_dir, args.logdir)
        try:
            export(args.run_dir, tracker, reading)
        except ReportError:
            raise
        except Exception as e:  # noqa: BLE001 - the tracker's failure, said with the exit status
            raise ReportError(EXIT_FAILED, f"{args.to} failed: {message(e)}") from None
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return e.code
    total = sum(reading.kinds.values())
    print(f"exported {total} record(s) ({reading.summary()}) to {args.to}: {tracker.where}", flush=True)
    if reading.skipped:
        print(f"skipped {reading.skipped} malformed or over-long line(s)", flush=True)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
