"""``python -m trainer.pipeline``: train a DFlash drafter; the process the console launches, watches and stops.

Two ways to run (``--launch``, docs/trainer.md):
- single process (CPU, or one device shared by both roles): target worker thread(s), one per
  ``--target-gpus`` device, feed a bounded hidden-state queue; the main thread runs the drafter role
  (``trainer.runtime.loop.Trainer``);
- multi-process: this process is the launcher (``trainer.runtime.launcher``) of one worker process per device on
  torch.distributed (``trainer.worker``); ``--launch torchrun`` lets torchrun start the workers.
Either way this process is the one to signal: it owns run.json, metrics.jsonl (docs/run-directory.md)
and the stop protocol; log lines go to stdout.

``python -m trainer.pipeline --version`` prints ``trainer VERSION`` and exits 0.

Exit status: 0 finished or stopped by SIGINT/SIGTERM (after a checkpoint), 1 error (a worker died, an
exception), 2 bad flags / data / busy run directory / no checkpoint that verifies (trainer/run/resume.py), 3 stopped after repeated NaN losses (after saving the
last good state), 4 the final checkpoint (of a stop or the end) could not be written (a full disk: the
``error`` event says what failed; ``latest`` still names the last complete checkpoint). Nothing in the
environment is a test hook: tests inject their faults from their own module (tests/support/faults.py).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from typing import NamedTuple

from trainer import __version__
from trainer.data.dataset import DataError
from trainer.evaluation.scheduler import make_scheduler
from trainer.run import checkpoint, rundir
from trainer.run.flags import FlagError, build_parser, check_devices
from trainer.run.resume import choose, set_aside
from trainer.run.settings import resolve
from trainer.run.startup import StartupEvents, expected
from trainer.run.stopping import StopControl
from trainer.runtime import compile_cache
from trainer.runtime.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, log
from trainer.runtime.loop import Trainer
from trainer.runtime.sources import ThreadedSource
from trainer.thread_names import name_this_thread
from trainer.tracking.dispatcher import start as start_tracking

__all__ = ["EXIT_ERROR", "EXIT_OK", "EXIT_USAGE", "main", "resolve_resume"]


def resolve_resume(resume: str, ckpt_root: str) -> str | None:
    """The checkpoint ``--resume`` resumes (trainer/run/resume.py: verified; nothing is set aside here)."""
    return choose(resume, ckpt_root).path


class Run(NamedTuple):
    """How this run runs, chosen once (``run_strategy``): ``run()`` -> (exit code, reason); ``close()`` after it
    whatever happened (in one process: the target threads stopped)."""

    run: Callable[[], tuple[int, str]]
    close: Callable[[], None]


def run_strategy(
    args, devices, stop, writer, reporter, run_dir: str, resume_path: str | None, startup
) -> Run:
    """``--launch single``: the drafter here, fed by target threads in this process (runtime/sources.py);
    otherwise this process is the launcher of one worker per device (runtime/launcher.py)."""
    if devices.mode == "single":
        source = ThreadedSource(args, devices, stop, reporter)
        trainer = Trainer(
            args, source, stop, writer, run_dir, resume_path, device=devices.drafter[0], startup=startup
        )

        def single() -> tuple[int, str]:
            trainer.setup()
            return trainer.train()

        return Run(single, source.close)
    from trainer.runtime.launcher import Launcher

    launcher = Launcher(args, devices, stop, writer, reporter, run_dir, resume_path)
    launcher.startup = startup
    return Run(launcher.run, lambda: None)


def run_reported(run: Run, writer, reporter) -> tuple[int, str]:
    """``run`` with its failures reported (stderr / train.log and an ``error`` event): (exit code, reason)."""
    try:
        return run.run()
    except (FlagError, DataError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        writer.event("error", message=str(e))
        return EXIT_USAGE, "error"
    except Exception as e:  # noqa: BLE001 - reported in metrics.jsonl and train.log, then exit 1
        traceback.print_exc()
        writer.event("error", message=f"{type(e).__name__}: {e}")
        return EXIT_ERROR, "error"
    finally:
        run.close()
        reporter.stop()


def main(argv: list[str] | None = None) -> int:
    pycache = compile_cache.bytecode_cache()  # before torch's import (the worker processes inherit it)
    stop = StopControl()
    stop.install()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    parser.add_argument("--version", action="version", version=f"trainer {__version__}")
    args = parser.parse_args(argv)  # exits 2 naming the flag on unknown/ill-typed flags
    run_dir = os.path.abspath(args.output_dir)
    ckpt_root = os.path.join(run_dir, "checkpoints")
    try:
        rundir.check_not_running(run_dir)
        rundir.refuse_links(
            run_dir
        )  # checkpoints/, metrics.jsonl, the trackers' folders: never written through a link
        chosen = choose(args.resume, ckpt_root)  # verified (trainer/run/resume.py); auto: never over bad ones
        # the settings take the drafter config of the checkpoint chosen (not merely the newest complete one)
        args.resume = chosen.path or "none"
        args = resolve(args)  # frozen settings: defaults (the family's, a resumed checkpoint's), checked
        devices = args.devices()
        if devices.mode != "torchrun":  # torchrun's workers may run on other nodes: each checks its own
            check_devices(devices, args.eval_device if args.eval_every else None)
    except (rundir.RunDirBusy, rundir.LinkRefused) as e:
        print(f"error: --output-dir: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except FlagError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    resume_path = chosen.path
    os.makedirs(run_dir, exist_ok=True)
    roles = {"target": devices.target, "drafter": devices.drafter}
    rundir.write_run_json(run_dir, rundir.run_info(run_dir, roles, __version__, args.drafter_record()))
    for n in checkpoint.remove_partial(ckpt_root):
        log(f"removed an unfinished checkpoint folder: {n}")
    set_aside(chosen, log)  # the newer ones that do not verify: step_N.bad, said in the log
    writer = rundir.MetricsWriter(os.path.join(run_dir, "metrics.jsonl"))
    # --report-to: every record from here on also goes to the trackers, in background threads (trainer/tracking/)
    tracking = start_tracking(
        args, run_dir, writer, resumed=resume_path is not None, log=log, version=__version__
    )
    start_step = int(checkpoint.read_manifest(resume_path)["step"]) if resume_path else 0
    startup = StartupEvents(writer, run_dir)  # start-up as events (trainer/run/startup.py)
    writer.event(
        "started",
        pid=os.getpid(),
        step=start_step,
        expected_first_step_s=expected(startup.history, "first_step_s"),
    )
    cache = compile_cache.prepare(run_dir, args)  # before anything compiles; the workers inherit it
    startup.phase("compile_cache", **cache)
    log(
        f"compile cache: {cache['state']} ({cache['reason']})"
        + (f" in {cache['dir']}" if "dir" in cache else "")
    )
    if pycache:
        log(pycache)
    log(
        f"trainer {__version__} pid {os.getpid()} run dir {run_dir}"
        + (f", resuming from {resume_path}" if resume_path else ", fresh start")
    )
    stop.writer = writer
    reporter = rundir.Reporter(writer, [], queue_stats=lambda: (0, args.hs_queue_depth))
    reporter.on_tick.append(stop.drain)
    evals = make_scheduler(args, run_dir, writer, log)  # --eval-every: separate processes (docs/evaluate.md)
    if evals is not None:
        reporter.on_tick.append(evals.poll)
    reporter.start()
    # the threads started from here on inherit the name until they name themselves (trainer/thread_names.py)
    name_this_thread("dflash-train" if devices.mode == "single" else "dflash-launch")
    run = run_strategy(args, devices, stop, writer, reporter, run_dir, resume_path, startup)
    code, reason = run_reported(run, writer, reporter)
    if evals is not None:
        evals.finish(reason, lambda: stop.requested)
    stop.drain()
    writer.event("stopped", reason=reason, exit_code=code)
    tracking.close()  # the trackers log what is queued and close their runs (bounded: CLOSE_S)
    log(f"stopped: {reason} (exit {code})")
    writer.close()
    return code


if __name__ == "__main__":
    exit_code = main()
    # Everything that matters is written, fsynced and closed (checkpoints, metrics.jsonl, the `stopped`
    # event); skip the interpreter's teardown, which took 2-8 s with torch loaded, so the console sees the
    # exit right after `stopped`.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)
