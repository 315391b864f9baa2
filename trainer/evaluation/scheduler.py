"""Evaluation during training (``--eval-every N``), in a separate process so that training never waits.

``EvalScheduler`` lives in the process that owns metrics.jsonl (the single-process trainer, or the launcher of a
multi-process run). It listens to the records written there: every N-th ``checkpoint_saved`` (counted in this
process) hard-links that checkpoint's ``export/`` (else ``drafter/``) files into ``RUN_DIR/evals/step_N/drafter``
at once (microseconds; the pruning of old checkpoints cannot take them away), and ``poll()`` (the reporter
thread, 10 times a second) starts ``python -m trainer.evaluate ... --json --no-baseline`` on ``--eval-device``
when no evaluation runs, the newest due checkpoint first (an older one still waiting is skipped). When it
exits, its JSON becomes an ``eval`` record (docs/run-directory.md); a failure an ``eval_failed`` event.

``finish(reason, should_stop)`` at the end of the run: a finished run also evaluates its last checkpoint and
waits for the evaluations (training is over; a stop signal cancels the wait); any other end cancels the
running one. The evaluation process exits by itself when the trainer dies (``--parent-pid`` watchdog).

``--keep-best``: each due checkpoint is held (hard links) until its evaluation ends, and the best evaluated one
is kept and named by ``checkpoints/best`` (evaluation/best.py). ``--eval-data est-holdout``: the prompts are the
``--est-holdout`` sequences, written by a thread first (evaluation/heldout.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time

from trainer.evaluation import best, heldout
from trainer.run.rundir import code_dir


class EvalScheduler:
    def __init__(self, args, run_dir: str, writer, log=print):
        self.args, self.run_dir, self.writer, self.log = args, run_dir, writer, log
        self.every = int(args.eval_every)
        self.root = os.path.join(run_dir, "evals")
        self.saves = 0
        self.last_saved: tuple[int, str] | None = None
        self.last_evaluated: int | None = None
        self.pending: tuple[int, str, str] | None = None  # (step, checkpoint path, linked drafter dir)
        self.proc: subprocess.Popen | None = None
        self.running: tuple[int, str, str, float] | None = None
        self._lock = threading.Lock()
        # --keep-best: the best evaluated checkpoint is kept (evaluation/best.py); held copies of a killed run go
        self.keep_best = None
        if getattr(args, "keep_best", False):
            self.keep_best = best.KeepBest(os.path.join(run_dir, "checkpoints"), self.root)
            best.release_all(self.root)
        # --eval-data est-holdout: the --est-holdout sequences, written as prompts by a thread (heldout.py)
        self.prompts = args.eval_data
        self.prompts_ready: threading.Event | None = None
        if args.eval_data == heldout.KEYWORD:
            self.prompts = os.path.join(self.root, heldout.FILE)
            self.prompts_ready = heldout.write_in_thread(args, self.prompts, self._prompts_failed)
        writer.listeners.append(self.on_record)

    def _prompts_failed(self, message: str) -> None:
        self.prompts = None
        self.writer.event(
            "eval_failed", step=None, checkpoint=None, message=f"--eval-data est-holdout: {message}"
        )
        self.log(f"eval: no evaluation: --eval-data est-holdout: {message}")

    # -- records -----------------------------------------------------------------------------------------
    def on_record(self, rec: dict) -> None:
        if rec.get("kind") != "event" or rec.get("name") != "checkpoint_saved":
            return
        step, path = rec.get("step"), rec.get("path")
        if not isinstance(step, int) or not isinstance(path, str):
            return
        self.saves += 1
        self.last_saved = (step, path)
        if self.saves % self.every == 0:
            self._due(step, path)

    def _due(self, step: int, path: str) -> None:
        try:
            linked = self._link(step, path)
        except OSError as e:
            self.writer.event(
                "eval_failed", step=step, checkpoint=path, message=f"cannot link the drafter: {e}"
            )
            return
        if self.keep_best is not None:
            try:
                best.hold(path, self.root, step)
            except OSError as e:  # evaluated all the same; kept only where the rotation has not removed it
                self.log(f"eval: checkpoint {path} not held for --keep-best: {e}")
        with self._lock:
            if self.pending is not None:
                self.log(f"eval: step {self.pending[0]} skipped (step {step} is newer)")
                self._release(self.pending[0])
            self.pending = (step, path, linked)

    def _release(self, step: int) -> None:
        if self.keep_best is not None:
            best.release(self.root, step)

    def _link(self, step: int, path: str) -> str:
        src = os.path.join(path, "export")
        if not os.path.isfile(os.path.join(src, "config.json")):
            src = os.path.join(path, "drafter")
        dst = os.path.join(self.root, f"step_{step:08d}", "drafter")
        shutil.rmtree(dst, ignore_errors=True)
        os.makedirs(dst)
        for fn in ("config.json", "model.safetensors"):
            try:
                os.link(os.path.join(src, fn), os.path.join(dst, fn))
            except OSError:
                shutil.copy2(os.path.join(src, fn), os.path.join(dst, fn))
        return dst

    # -- processes ---------------------------------------------------------------------------------------
    def poll(self) -> None:
        with self._lock:
            if self.proc is not None and self.proc.poll() is not None:
                self._collect()
            if self.prompts_ready is not None and not self.prompts_ready.is_set():
                return  # the held-out prompts are still being written: the due checkpoint waits
            if self.prompts is None and self.pending is not None:  # they could not be: said once
                self._release(self.pending[0])
                self.pending = None
            if self.proc is None and self.pending is not None:
                step, path, linked = self.pending
                self.pending = None
                self._start(step, path, linked)

    def _start(self, step: int, path: str, linked: str) -> None:
        a = self.args
        out_dir = os.path.dirname(linked)
        argv = [
            sys.executable, "-m", "trainer.evaluate", "--target-model", a.target_model, "--drafter", linked,
            "--prompts", self.prompts, "--num-prompts", str(a.eval_prompts), "--max-new-tokens",
            str(a.eval_new_tokens), "--device", a.eval_device, "--temperature", "0", "--no-baseline", "--json",
            "--parent-pid", str(os.getpid()),
        ]  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (code_dir(), env.get("PYTHONPATH")) if p)
        with (
            open(os.path.join(out_dir, "result.json"), "wb") as out,
            open(os.path.join(out_dir, "eval.log"), "wb") as err,
        ):
            self.proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        self.running = (step, path, out_dir, time.monotonic())
        self.log(f"eval: step {step} started on {a.eval_device} (pid {self.proc.pid})")

    def _collect(self) -> None:
        step, path, out_dir, t0 = self.running
        rc = self.proc.returncode
        self.proc, self.running = None, None
        seconds = time.monotonic() - t0
        self.last_evaluated = step
        try:
            with open(os.path.join(out_dir, "result.json"), encoding="utf-8") as f:
                rep = json.loads(f.read().strip().splitlines()[-1]) if rc == 0 else None
        except (OSError, ValueError, IndexError):
            rep = None
        if rep is None:
            tail = ""
            with contextlib.suppress(OSError), open(os.path.join(out_dir, "eval.log"), "rb") as f:
                tail = f.read()[-400:].decode("utf-8", "replace").strip()
            self.writer.event("eval_failed", step=step, checkpoint=path, message=f"exit {rc}: {tail}")
            self.log(f"eval: step {step} failed (exit {rc})")
            self._release(step)
            return
        extra = self._keep_best(step, path, rep["mean_accept_len"])
        self.writer.write(
            "eval",
            step=step,
            checkpoint=path,
            accept_len=rep["mean_accept_len"],
            accept_len_se=rep.get("mean_accept_len_se"),
            per_position=rep["per_position"],
            histogram=rep["histogram"],
            prompts=rep["prompts"],
            new_tokens=rep["max_new_tokens"],
            temperature=rep["temperature"],
            device=rep["device"],
            seconds=seconds,
            **extra,
        )
        self.log(f"eval: step {step} accept_len {rep['mean_accept_len']:.3f} ({seconds:.1f} s)")

    def _keep_best(self, step: int, path: str, accept_len) -> dict:
        """--keep-best: whether checkpoint ``step`` is the best evaluated so far (the eval record's ``best``);
        a new best is said in a ``best_checkpoint`` event. Its held copy goes either way."""
        if self.keep_best is None:
            return {}
        before = self.keep_best.best
        try:
            is_best, why = self.keep_best.consider(step, float(accept_len))
        except (OSError, TypeError, ValueError) as e:
            is_best, why = False, f"{type(e).__name__}: {e}"
        finally:
            self._release(step)
        if why is not None:
            self.writer.event("eval_failed", step=step, checkpoint=path, message=f"--keep-best: {why}")
        if is_best:
            self.writer.event(
                "best_checkpoint",
                step=step,
                checkpoint=path,
                accept_len=accept_len,
                previous_step=None if before is None else before[1],
                previous_accept_len=None if before is None else before[0],
            )
            self.log(f"eval: step {step} is the best so far (checkpoints/best)")
        return {"best": is_best}

    def cancel(self, why: str) -> None:
        with self._lock:
            if self.pending is not None:
                self._release(self.pending[0])
            self.pending = None
            if self.proc is None:
                return
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            step, path, _, _ = self.running
            self.proc, self.running = None, None
            self._release(step)
        self.writer.event("eval_failed", step=step, checkpoint=path, message=f"cancelled: {why}")

    def finish(self, reason: str, should_stop) -> None:
        if reason != "finished":
            self.cancel(f"the trainer stopped ({reason})")
            return
        if self.last_saved is not None and self.last_saved[0] != self.last_evaluated:
            with self._lock:
                due = self.pending is None or self.pending[0] != self.last_saved[0]
            if due and (self.running is None or self.running[0] != self.last_saved[0]):
                self._due(*self.last_saved)
        while True:
            self.poll()
            with self._lock:
                idle = self.proc is None and self.pending is None
            if idle:
                return
            if should_stop():
                self.cancel("stop requested")
                return
            time.sleep(0.1)


def make_scheduler(args, run_dir: str, writer, log=print) -> EvalScheduler | None:
    return EvalScheduler(args, run_dir, writer, log) if getattr(args, "eval_every", 0) else None
