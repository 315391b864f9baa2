"""``dflash-console status ... --check``: the health rules once, as a monitoring plugin answers.

Exit codes follow the monitoring-plugin convention (Nagios, Icinga, Sensu, ...): 0 OK, 1 WARNING,
2 CRITICAL, 3 UNKNOWN (cannot connect; no trainer found and none expected), with one line of text.
The rules are console/core/health.py's, fed from what is there now: the trainer (verified in /proc),
the last MiB of metrics.jsonl, one nvidia-smi query and the run directory's checkpoints and free space.
"""

from __future__ import annotations

import time

from console.core import control
from console.core.checkpoints import scan
from console.core.events import GpuSample, TrainerFound
from console.core.health import CRITICAL, NOTE, OK, RANK, WARNING, Health, HealthConfig
from console.core.helper import HelperError
from console.core.telemetry import nvidia_smi_argv, parse_output

EXIT = {OK: 0, NOTE: 0, WARNING: 1, CRITICAL: 2}
UNKNOWN = 3
NAME = "DFLASH"


def line(level: str, text: str) -> str:
    return f"{NAME} {level.upper()}: {text}"


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
    records = await control.recent_records(helper, run_dir, 1 << 20) if run_dir else []
    for rec in records:
        t = rec.get("t")
        health.apply_record(rec, recv=min(t, now) if isinstance(t, (int, float)) else None)
    if trainer is None and not any(r.get("kind") == "event" and r.get("name") == "started" for r in records):
        where = f" for {run_dir}" if run_dir else ""
        return UNKNOWN, line("unknown", f"no trainer found{where} and none expected (no run recorded)")
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
