"""A drafter's checkpoints as the step loop takes them: when one is due, the write (``run.checkpoint``'s
atomic writer) with its ``checkpoint_saving`` / ``checkpoint_saved`` / ``error`` events, what a checkpoint
holds (drafter, export, ``state.pt``), and the durations of past saves (``expected_s``)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import time

from trainer import __version__
from trainer.run import checkpoint, rundir, state_file
from trainer.runtime.drafter_state import DrafterState

SAVE_TIMES = "save_seconds.json"  # in checkpoints/: durations of past saves


def past_save_seconds(ckpt_root: str, saved: list[float]) -> list[float]:
    """Durations of past saves on a resume: the run dir's record of them, else the checkpoint's ``saved``."""
    with contextlib.suppress(OSError, ValueError), open(os.path.join(ckpt_root, SAVE_TIMES)) as f:
        return [float(x) for x in json.load(f)]
    return list(saved)


def rng_state(generator) -> dict:
    """Every RNG's state in types the safe loader reads back (trainer/run/state_file.py): tensors, tuples."""
    import torch

    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "python": random.getstate(),  # (version, tuple of ints, None)
        "numpy": state_file.pack_numpy_rng(),
        "generator": generator.get_state(),
    }


class Checkpointer:
    """Writes checkpoints of a ``DrafterState`` into ``RUN/checkpoints``. ``stop``: the run's StopControl (or
    a worker's stand-in): its pending events go out first, and ``saving`` is set during a write."""

    def __init__(self, args, run_dir: str, resume_path: str | None, stop, writer, log):
        self.args, self.resume_path, self.stop, self.writer, self.log = args, resume_path, stop, writer, log
        self.ckpt_root = os.path.join(run_dir, "checkpoints")
        self.last_save_t = time.monotonic()  # the last save attempt (--save-every-minutes counts from it)

    def save_due(self, step: int) -> bool:
        """A periodic save now? (``--save-every`` steps, or ``--save-every-minutes`` since the last save)"""
        a = self.args
        if a.save_every and step % a.save_every == 0:
            return True
        minutes = getattr(a, "save_every_minutes", 0)
        return bool(minutes) and time.monotonic() - self.last_save_t >= minutes * 60

    def save(self, st: DrafterState) -> bool:
        """Write a checkpoint of the current step; False when the write failed (a full disk...).

        A failed save leaves no partial folder and ``latest`` naming the last complete checkpoint; an
        ``error`` event says what failed and how much space is free; training may go on and the next
        save tries again.
        """
        self.stop.drain()  # a pending stop_requested goes out before checkpoint_saving
        recent = st.save_seconds[-3:]
        expected = sum(recent) / len(recent) if recent else None
        self.writer.event("checkpoint_saving", step=st.step, expected_s=expected)
        self.log(f"saving checkpoint at step {st.step}" + (f" (about {expected:.1f}s)" if expected else ""))
        self.stop.saving = True
        t0 = time.monotonic()
        try:
            path, nbytes, reused = self._write(st)
        except OSError as e:
            self.save_failed(st.step, e)
            return False
        finally:
            self.stop.saving = False
            self.last_save_t = time.monotonic()
        seconds = time.monotonic() - t0
        if not reused:  # a real write: a data point for expected_s
            st.save_seconds.append(seconds)
            with contextlib.suppress(OSError):  # kept for the next run in this dir
                rundir.atomic_write_text(
                    os.path.join(self.ckpt_root, SAVE_TIMES), json.dumps(st.save_seconds[-10:])
                )
        self.stop.drain()
        self.writer.event("checkpoint_saved", step=st.step, path=path, seconds=seconds, bytes=nbytes)
        self.log(f"checkpoint saved: {path} ({nbytes / 1e6:.1f} MB, {seconds:.2f}s)")
        return True

    def _write(self, st: DrafterState) -> tuple[str, int, bool]:
        """(path, bytes, reused): the checkpoint written, or the resumed one where nothing trained since."""
        existing = os.path.join(self.ckpt_root, checkpoint.step_dir_name(st.step))
        if st.resumed_step == st.step and self.resume_path == existing and checkpoint.is_complete(existing):
            # nothing trained since this checkpoint was loaded: it is this state
            nbytes = sum(checkpoint.read_manifest(existing)["files"].values()) + os.path.getsize(
                os.path.join(existing, checkpoint.MANIFEST)
            )
            return existing, nbytes, True
        meta = {
            "cursor": st.cursor,
            "epoch": st.plan.epoch_progress(st.cursor),
            "time": time.time(),
            "version": __version__,
            "total_steps": st.total_steps,
        }
        path, nbytes = checkpoint.save(
            self.ckpt_root,
            st.step,
            lambda tmp: self._payload(st, tmp),
            meta,
            keep=getattr(self.args, "keep_checkpoints", 2),
        )
        return path, nbytes, False

    def _payload(self, st: DrafterState, tmp: str) -> None:
        import torch

        st.optimizer_ready()

        from trainer.model import save_drafter

        save_drafter(st.drafter, st.cfg, os.path.join(tmp, "drafter"))  # training dtype: exact resume
        export_dtype = torch.float32 if getattr(self.args, "export_fp32", False) else torch.bfloat16
        save_drafter(st.drafter, st.cfg, os.path.join(tmp, "export"), dtype=export_dtype)  # for serving
        state = {
            "step": st.step,
            "cursor": st.cursor,
            "optimizer": st.optimizer.state_dict(),
            "rng": rng_state(st.generator),
            "save_seconds": st.save_seconds[-10:],
            "accept_est_window": list(st.est_window),
            "flags": vars(self.args),
            "data_fingerprint": st.ds.fingerprint(),
            "version": __version__,
        }
        torch.save(state, os.path.join(tmp, state_file.STATE_FILE))

    def save_failed(self, step: int, e: OSError) -> None:
        try:
            free = f"{shutil.disk_usage(self.ckpt_root).free / 1e6:.1f} MB free"
        except OSError:
            free = "free space unknown"
        msg = (
            f"checkpoint at step {step} failed: {e} ({free} on {self.ckpt_root}); the partial "
            f"checkpoint was removed and checkpoints/latest still names the last complete one"
        )
        self.stop.drain()
        with contextlib.suppress(OSError):  # the disk may refuse this line too
            self.writer.event("error", message=msg, step=step)
        self.log("error: " + msg)
