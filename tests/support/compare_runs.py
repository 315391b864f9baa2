"""Three runs of fixed, synthetic data recorded as ``connect --record`` writes them (console/core/record.py),
for the compare view's snapshot and replay tests: smooth curves with a deterministic wobble, different
step rates (so by step and by time differ), measured acceptance every 100 steps, one run still
running and two that have ended."""

from __future__ import annotations

import math
from pathlib import Path

from console.core.events import ConnState, LogLines, Record, TrainerFound, TrainerInfo
from console.core.record import Recorder

T0 = 1_800_000_000.0
# label, where, steps, seconds a step, loss scale, acceptance scale
RUNS = [
    ("baseline", "127.0.0.1 · CT 200", 400, 1.0, 80.0, 2.2),
    ("lr-2e-3", "127.0.0.1 · CT 201", 300, 1.5, 45.0, 2.6),
    ("block-16", "127.0.0.1 · CT 202", 200, 2.0, 120.0, 1.8),
]


def run_records(i: int) -> list[dict]:
    """Run i's metrics records, in time order."""
    _, _, steps, dt, tau, acc = RUNS[i]
    start = T0 + 30.0 * i
    out: list[dict] = [{"t": start, "kind": "event", "name": "started", "pid": 1000 + i, "step": 0}]
    for s in range(1, steps + 1):
        t = start + s * dt
        loss = 0.4 + 5.0 * math.exp(-s / tau) + 0.12 * math.sin(s / 3 + i)
        est = 1.0 + acc * (1 - math.exp(-s / 150)) + 0.05 * math.sin(s / 5)
        out.append(
            {"t": t, "kind": "step", "step": s, "total_steps": 1000, "loss": loss, "accept_len_est": est}
        )
        tok = 2400.0 - 500 * i + 150 * math.sin(s / 7 + i)
        out.append(
            {
                "t": t + dt / 2,
                "kind": "throughput",
                "devices": [{"device": "cpu", "uuid": None, "role": "drafter", "tok_s": tok, "busy": 1.0}],
                "queue": {"depth": 2, "capacity": 8},
            }
        )
        if s % 100 == 0:
            out.append(
                {"t": t + 0.1, "kind": "eval", "step": s, "accept_len": est + 0.3, "accept_len_se": 0.1}
            )
    if i:  # runs 1 and 2 have ended
        end = start + steps * dt + 1
        out.append({"t": end, "kind": "event", "name": "stopped", "reason": "finished", "exit_code": 0})
    return out


def write_record(path: Path) -> Path:
    """The three runs as one record: each connected, its trainer found (or gone), its records and a log line."""
    now = [T0 - 1.0]
    rec = Recorder(
        path, [{"label": label, "where": where} for label, where, *_ in RUNS], clock=lambda: now[0]
    )
    events: list[tuple[float, int, object]] = []
    for i in range(len(RUNS)):
        events.append((T0 - 1.0, i, ConnState("connected", "ok")))
        trainer = (
            TrainerInfo(1000 + i, 1, ["python3", "-m", "trainer.pipeline"], "/run", "run.json")
            if i == 0
            else None
        )
        events.append((T0 - 0.5, i, TrainerFound(trainer)))
        events.extend((r["t"], i, Record(r)) for r in run_records(i))
        events.append((T0 + 1.0, i, LogLines([f"log of {RUNS[i][0]}"])))
    for t, i, ev in sorted(events, key=lambda e: e[0]):
        now[0] = t
        rec.write(i, ev)
    rec.close()
    return path
