"""``dflash-console status ... --check``: the health rules once, as a monitoring plugin answers.

Exit codes follow the monitoring-plugin convention (Nagios, Icinga, Sensu, ...): 0 OK, 1 WARNING,
2 CRITICAL, 3 UNKNOWN (cannot connect; no trainer found and none expected), with one line of text.
The rules are console/core/health.py's, fed from what is there now: the trainer (verified in /proc),
the run's history in metrics.jsonl (:func:`run_records`: the last MiB, and the events back to the run's
last ``started`` however long ago it was, up to ``HISTORY_MAX`` bytes), one nvidia-smi query and the run
directory's checkpoints and free space.
"""

from __future__ import annotations

import posixpath
import time

from console.core.checkpoints import scan
from console.core.events import GpuSample, JobState, TrainerFound
from console.core.health import CRITICAL, NOTE, OK, RANK, WARNING, Health, HealthConfig
from console.core.helper import Helper, HelperError
from console.core.metrics import MetricsParser
from console.core.telemetry import nvidia_smi_argv, parse_output

EXIT = {OK: 0, NOTE: 0, WARNING: 1, CRITICAL: 2}
UNKNOWN = 3
NAME = "DFLASH"


WINDOW = 1 << 20  # every record of the last MiB (the rules' recent figures)
CHUNK = 1 << 20  # read backwards this much at a time (the helper's most per read)
HISTORY_MAX = 64 << 20  # before the window: events back to the last `started`, at most this far back


def line(level: str, text: str) -> str:
    return f"{NAME} {level.upper()}: {text}"


def _is_start(rec: dict) -> bool:
    return rec.get("kind") == "event" and rec.get("name") == "started"


def _events(data: bytes) -> list[dict]:
    """The ``event`` records of complete lines (only lines that can hold one are parsed)."""
    keep = b"".join(ln + b"\n" for ln in data.split(b"\n") if b'"event"' in ln)
    return [r for r in MetricsParser().feed(keep) if r.get("kind") == "event"]


async def _events_before(helper: Helper, path: str, end: int, limit: int) -> tuple[list[dict], bool]:
    """(the event records of ``path`` before byte ``end``, from its last ``started`` on; whether one was
    found or the file was read to its first byte), reading backwards in chunks, at most ``limit`` bytes."""
    found: list[dict] = []
    carry = b""  # the start of the line cut at the previous (later) chunk's front
    pos = end
    while pos > 0 and end - pos < limit:
        n = min(CHUNK, pos)
        data, pos, _ = await helper.read(path, pos - n, n)
        buf = data + carry
        nl = buf.find(b"\n")
        cut = 0 if pos == 0 else (len(buf) if nl < 0 else nl + 1)  # the line cut at the chunk's front
        carry = buf[:cut] if cut <= WINDOW else b""  # a longer line is no record
        found = _events(buf[cut:]) + found
        starts = [i for i, r in enumerate(found) if _is_start(r)]
        if starts:
            return found[starts[-1] :], True
    return found, pos == 0


async def run_records(helper: Helper, run_dir: str, limit: int = HISTORY_MAX) -> tuple[list[dict], bool]:
    """(the records --check judges: the last ``WINDOW`` of metrics.jsonl, preceded by the events back to
    the run's last ``started`` when that lies before it; whether the run's start is among them or the
    file was read from its first byte)."""
    path = posixpath.join(run_dir, "metrics.jsonl")
    try:
        data, start, _ = await helper.read(path, -WINDOW, WINDOW)
    except HelperError as e:
        if e.kind == "FileNotFoundError":
            return [], True
        raise
    cut = data.find(b"\n") + 1 if start > 0 else 0
    records = MetricsParser().feed(data[cut:])
    if start == 0 or any(_is_start(r) for r in records):
        return records, True
    earlier, found = await _events_before(helper, path, start + cut, limit)
    return earlier + records, found


async def check(
    session, config: HealthConfig | None = None, bundled_key: str | None = None
) -> tuple[int, str]:
    """(exit code, one line) for the session's trainer and run dir."""
    now = time.time()
    health = Health(config, clock=lambda: now, bundled_key=bundled_key)
    helper = session.need_helper()
    trainer = await session.find_trainer()
    run_dir = session.run_dir
    health.apply(TrainerFound(trainer))
    records, whole = await run_records(helper, run_dir) if run_dir else ([], True)
    for rec in records:
        t = rec.get("t")
        health.apply_record(rec, recv=min(t, now) if isinstance(t, (int, float)) else None)
    if trainer is None and not any(_is_start(r) for r in records):
        where = f" for {run_dir}" if run_dir else ""
        why = (
            "no run recorded"
            if whole
            else f"no `started` in the last {HISTORY_MAX >> 20} MiB of metrics.jsonl"
        )
        return UNKNOWN, line("unknown", f"no trainer found{where} and none expected ({why})")
    if isinstance(session.run, dict):
        health.f.run = session.run
    try:
        r = await helper.run(nvidia_smi_argv(None), timeout=15)
        if r["rc"] == 0:
            health.apply(GpuSample(parse_output(r["stdout"])))
    except HelperError:
        pass  # no GPUs to judge (a CPU run): the other rules still hold
    if run_dir:
        try:
            health.apply(await scan(helper, run_dir, session.run))
        except HelperError:
            pass
    job = await session.job_state()  # a Slurm job: its time left (the job_time_left rule)
    if job is not None and "error" not in job:
        health.apply(JobState.of(job, now))
    health.evaluate()
    alerts = health.alerts()
    worst = max((a.level for a in alerts), key=RANK.__getitem__, default=OK)
    serious = [a for a in alerts if a.level != NOTE]
    if serious:
        text = "; ".join(a.message for a in serious)
    elif trainer is not None:
        step = health.f.step
        text = f"trainer PID {trainer.pid} running" + (f", step {step}" if step is not None else "")
    else:
        reason = (health.f.stopped or {}).get("reason") or "stop requested"
        text = f"no trainer running; the last run stopped cleanly ({reason})"
    notes = [a.message for a in alerts if a.level == NOTE]
    if notes:
        text += " (note: " + "; ".join(notes) + ")"
    return EXIT[worst], line(worst if worst != NOTE else OK, text)
