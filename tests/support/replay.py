"""A recorded tiny-trainer run (tests/data/tiny_run) as the session events it produced, with a
frozen clock, for snapshots that never flake.

The recording is a real CPU run (``python -m trainer.tiny`` then ``python -m trainer.pipeline
... --target-gpus cpu --drafter-gpus cpu --save-every 20``, stopped by SIGINT at step 21). Its two
``cpu`` devices are relabelled GPU 0 (target) and GPU 1 (drafter) so that the table joins them with
fixed GPU samples; every other value is as recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

from console.core.events import (
    ConnState,
    Gpu,
    GpuSample,
    LogLines,
    Record,
    TelemetryState,
    TrainerFound,
    TrainerInfo,
)
from console.core.metrics import parse_line

DATA = Path(__file__).resolve().parents[1] / "data" / "tiny_run"
GPUS = [
    Gpu(
        0, "GPU-6f1c0000-0000-0000-0000-000000000000", "NVIDIA H200", 97.0, 101_204.0, 143_771.0, 612.4, 67.0
    ),
    Gpu(1, "GPU-6f1c0000-0000-0000-0000-000000000001", "NVIDIA H200", 84.0, 38_410.0, 143_771.0, 455.9, 58.0),
]


def _as_gpus(rec: dict) -> dict:
    if rec.get("kind") == "throughput":
        for d in rec.get("devices") or []:
            i = 0 if d.get("role") == "target" else 1
            d["device"], d["uuid"] = f"cuda:{i}", GPUS[i].uuid
    return rec


def recorded(until: str = "stop_requested") -> tuple[list, float]:
    """(events, t of the last record) up to, not including, the first event named ``until``."""
    run = json.loads((DATA / "run.json").read_text())
    trainer = TrainerInfo(run["pid"], run["start_time"], run["command"], run["output_dir"], "run.json", run)
    events: list = [ConnState("connected"), TrainerFound(trainer), TelemetryState(True), GpuSample(GPUS)]
    last_t = 0.0
    for line in (DATA / "metrics.jsonl").read_text().splitlines():
        rec = parse_line(line)
        if rec is None:
            continue
        if rec.get("kind") == "event" and rec.get("name") == until:
            break
        events.append(Record(_as_gpus(rec)))
        last_t = rec["t"] or last_t
    log = (DATA / "train.log").read_text().splitlines()
    cut = next((i for i, line in enumerate(log) if "SIGINT" in line), len(log))
    events.append(LogLines(log[:cut]))
    return events, last_t
