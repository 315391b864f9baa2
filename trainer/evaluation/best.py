"""``--keep-best``: the checkpoint whose evaluation (``--eval-every``) read the highest acceptance is kept.

While a checkpoint waits for its evaluation or is evaluated, ``hold`` keeps a copy of it by hard links in
``evals/step_N/checkpoint/`` (no bytes copied), so that the rotation of ``--keep-checkpoints`` cannot take it
away meanwhile. When the evaluation ends, ``KeepBest.consider``: where its ``accept_len`` is above the best so
far, ``checkpoints/best`` is written (atomically, as ``latest``) naming ``step_N``, and ``step_N/`` is put
back from the held links if the rotation had removed it (linked into a ``.tmp-`` folder, then renamed: whole
or absent). The rotation never removes the checkpoint ``best`` names (trainer/run/checkpoint.py ``_prune``).
Then the held links go (``release``). Links are never followed: only regular files are linked, a link or
anything else in the tree is left out.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import uuid

from trainer.run import checkpoint
from trainer.run.rundir import atomic_write_text, own_dir

HELD = "checkpoint"  # evals/step_N/checkpoint/: the held copy


def held_dir(evals_root: str, step: int) -> str:
    return os.path.join(evals_root, checkpoint.step_dir_name(step), HELD)


def link_tree(src: str, dst: str) -> None:
    """Hard-link every regular file under ``src`` into the same place under ``dst`` (made here)."""
    os.makedirs(dst)
    for d, dirs, files in os.walk(src):  # os.walk does not descend into linked folders
        rel = os.path.relpath(d, src)
        for name in dirs:
            if not os.path.islink(os.path.join(d, name)):
                os.makedirs(os.path.join(dst, rel, name), exist_ok=True)
        for name in files:
            p = os.path.join(d, name)
            if stat.S_ISREG(os.lstat(p).st_mode):
                os.link(p, os.path.join(dst, rel, name), follow_symlinks=False)


def hold(ckpt_path: str, evals_root: str, step: int) -> str:
    """A held copy (hard links) of the checkpoint at ``ckpt_path``: ``evals/step_N/checkpoint/``."""
    dst = held_dir(evals_root, step)
    shutil.rmtree(dst, ignore_errors=True)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    link_tree(ckpt_path, dst)
    return dst


def release(evals_root: str, step: int) -> None:
    shutil.rmtree(held_dir(evals_root, step), ignore_errors=True)


def release_all(evals_root: str) -> None:
    """The held copies a killed run left (its evaluations will not end)."""
    try:
        names = os.listdir(evals_root)
    except OSError:
        return
    for name in names:
        if checkpoint.STEP_RE.match(name):
            shutil.rmtree(os.path.join(evals_root, name, HELD), ignore_errors=True)


def _result_accept_len(evals_root: str, name: str) -> float | None:
    """The acceptance of an earlier evaluation (its ``result.json``: the evaluation's JSON on its last line)."""
    try:
        with open(os.path.join(evals_root, name, "result.json"), "rb") as f:
            rep = json.loads(f.read(1 << 20).decode("utf-8", "replace").strip().splitlines()[-1])
        v = rep["mean_accept_len"]
        return float(v) if isinstance(v, (int, float)) else None
    except (OSError, ValueError, IndexError, KeyError, TypeError, AttributeError):
        return None


class KeepBest:
    """The best evaluation so far (a resumed run's from ``checkpoints/best`` and its result.json)."""

    def __init__(self, ckpt_root: str, evals_root: str):
        self.ckpt_root, self.evals_root = ckpt_root, evals_root
        self.best: tuple[float, int] | None = None  # (accept_len, step)
        name = checkpoint.read_pointer(ckpt_root, checkpoint.BEST)
        if name is not None:
            acc = _result_accept_len(evals_root, name)
            if acc is not None:
                self.best = (acc, int(checkpoint.STEP_RE.match(name).group(1)))

    def consider(self, step: int, accept_len: float) -> tuple[bool, str | None]:
        """(whether checkpoint ``step`` is now the best, why it could not be kept where it is not). ``best`` is
        written before the folder is put back: a rotation that lists the folders after reads ``best`` after."""
        if self.best is not None and not accept_len > self.best[0]:
            return False, None
        name = checkpoint.step_dir_name(step)
        final = os.path.join(self.ckpt_root, name)
        own_dir(self.ckpt_root)
        self._point(name)
        why = None if checkpoint.is_complete(final) else self._put_back(step, final)
        if why is not None:  # the earlier best stays best
            self._point(None if self.best is None else checkpoint.step_dir_name(self.best[1]))
            return False, why
        self.best = (accept_len, step)
        return True, None

    def _point(self, name: str | None) -> None:
        path = os.path.join(self.ckpt_root, checkpoint.BEST)
        if name is not None:
            atomic_write_text(path, name + "\n")
        elif os.path.lexists(path):
            os.unlink(path)

    def _put_back(self, step: int, final: str) -> str | None:
        """``step_N/`` from its held copy (it was rotated away meanwhile); None, or why it could not be."""
        held = held_dir(self.evals_root, step)
        if not checkpoint.is_complete(held):
            return f"{final} is gone and no complete copy of it was held"
        tmp = f"{final}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            link_tree(held, tmp)
            os.rename(tmp, final)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            return f"cannot put {final} back: {e}"
        return None
