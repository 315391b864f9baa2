"""What a stop checks around its one signal besides the process itself: that run.json still names the
process the stop verified, and that no other trainer of the run directory is left running.

Whoever can write the run directory can rewrite run.json to name a process of her own (a trainer-like
command line with ``--output-dir`` = the run dir, which the identity rule accepts as the run.json
owner's) and write its events into metrics.jsonl. A stop is about one process, pinned by PID and start
time before the signal; these checks keep its verdict about that process: a run.json that names
another one before the signal refuses the stop, and one rewritten during it, or another trainer of
the same run directory still running at its end, is said, and the stop is not reported as a success.
"""

from __future__ import annotations

import posixpath
import shlex

from console.core.events import ActionResult, Outcome, TrainerInfo
from console.core.finding import read_run_json, visible_trainers
from console.core.helper import Helper


async def run_json_names(helper: Helper, trainer: TrainerInfo) -> tuple | None:
    """(pid, start_time) that the run directory's run.json names now; None without a run dir or a
    run.json (or one that names no pid)."""
    if not trainer.run_dir:
        return None
    run = await read_run_json(helper, trainer.run_dir)
    if not run or not isinstance(run.get("pid"), int):
        return None
    st = run.get("start_time")
    return run["pid"], st if isinstance(st, int) else None


def _said(named: tuple | None) -> str:
    if named is None:
        return "no process"
    pid, st = named
    return f"pid {pid} (start time {st})" if st is not None else f"pid {pid} (no start time)"


async def rewritten(helper: Helper, trainer: TrainerInfo) -> str | None:
    """What run.json names now, said, when the stop's trainer was found through it and it no longer
    names that process (PID and start time); else None."""
    if trainer.source != "run.json" or not trainer.run_dir:
        return None
    named = await run_json_names(helper, trainer)
    if named == (trainer.pid, trainer.start_time):
        return None
    return f"run.json now names {_said(named)}, not pid {trainer.pid} (start time {trainer.start_time})"


async def others(helper: Helper, trainer: TrainerInfo) -> list[TrainerInfo]:
    """Trainers of the same run directory (their ``--output-dir``) that are not ``trainer``."""
    if not trainer.run_dir:
        return []
    run_dir = posixpath.normpath(trainer.run_dir)
    return [t for t in await visible_trainers(helper) if t.run_dir == run_dir and t.pid != trainer.pid]


def describe(found: list[TrainerInfo]) -> str:
    """The other trainers, as a message names them."""
    return ", ".join(f"pid {t.pid} ({shlex.join(t.cmdline)[:100]})" for t in found[:4]) + (
        f" and {len(found) - 4} more" if len(found) > 4 else ""
    )


async def verdict(helper: Helper, trainer: TrainerInfo, res: ActionResult) -> ActionResult:
    """``res`` (how the stop of ``trainer`` ended), unless run.json was rewritten meanwhile or another
    trainer of the run directory still runs: then it says so, and is no success."""
    notes = []
    changed = await rewritten(helper, trainer)
    if changed:
        notes.append(
            f"run.json was rewritten during the stop: {changed}; this outcome is pid {trainer.pid}'s"
        )
    left = await others(helper, trainer)
    if left:
        notes.append(
            f"still running with --output-dir {trainer.run_dir}: {describe(left)}: the run is not stopped"
        )
    if not notes:
        return res
    code = Outcome.ERROR if res.code == Outcome.OK else res.code
    return ActionResult(code, f"{res.message}; but {'; '.join(notes)}", res.trainer, res.checkpoint)
