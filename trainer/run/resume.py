"""Which checkpoint ``--resume`` resumes, verified before anything is loaded from it.

A checkpoint resumes when it verifies (``check``): its manifest, every file at the listed size and
SHA-256 (trainer/run/checkpoint.py ``verify``), a drafter config.json that parses, and a ``state.pt`` the
safe loader reads (trainer/run/state_file.py). ``--resume auto`` tries the one ``latest`` names, then the
others newest first; the first that verifies is resumed, and each newer one that did not is set aside
(``step_N.bad``: never pruned, overwritten or resumed) with a log line saying why. Where checkpoints
exist and none verifies, ``--resume auto`` is refused (exit 2, every one named with what is wrong)
rather than starting fresh over them: ``--resume none`` starts fresh beside them, ``--resume PATH``
names one. ``--resume PATH`` that does not verify is refused the same way.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import NamedTuple

from trainer.run import checkpoint, state_file
from trainer.run.flags import FlagError


class Choice(NamedTuple):
    path: str | None  # the checkpoint to resume; None: a fresh start
    rejected: list[tuple[str, str]]  # (checkpoint, what is wrong): newer ones that do not verify


def check(path: str) -> str | None:
    """None when the checkpoint at ``path`` can be resumed; else what is wrong with it, naming the file."""
    why = checkpoint.verify(path)
    if why is not None:
        return why
    cfg = os.path.join(path, "drafter", "config.json")
    try:
        with open(cfg, encoding="utf-8") as f:
            if not isinstance(json.load(f), dict):
                return f"{cfg}: not a JSON object"
    except (OSError, ValueError) as e:
        return f"{cfg}: {getattr(e, 'strerror', None) or e}"
    try:
        state_file.load_state(path)  # memory-mapped: the pickle is read, the tensors are not
    except state_file.StateFileError as e:
        return str(e)
    return None


def candidates(ckpt_root: str) -> list[str]:
    """The checkpoint ``latest`` names first, then every ``step_N/`` newest first."""
    names = sorted(checkpoint.list_steps(ckpt_root), reverse=True)
    try:
        with open(os.path.join(ckpt_root, "latest"), encoding="utf-8") as f:
            named = f.read(200).strip()
    except (OSError, ValueError):
        named = ""
    if named in names:
        names.remove(named)
        names.insert(0, named)
    return [os.path.join(ckpt_root, n) for n in names]


def choose(resume: str, ckpt_root: str) -> Choice:
    """The checkpoint ``--resume`` (auto | none | PATH) resumes, or ``FlagError`` naming what is wrong."""
    if resume == "none":
        return Choice(None, [])
    if resume != "auto":
        path = os.path.abspath(resume)
        why = check(path)
        if why is not None:
            raise FlagError("--resume", f"{resume!r} cannot be resumed: {why}")
        return Choice(path, [])
    rejected: list[tuple[str, str]] = []
    for path in candidates(ckpt_root):
        why = check(path)
        if why is None:
            return Choice(path, rejected)
        rejected.append((path, why))
    if rejected:
        listed = "; ".join(f"{os.path.basename(p)}: {why}" for p, why in rejected)
        raise FlagError(
            "--resume",
            f"auto: no checkpoint in {ckpt_root} verifies ({listed}). Nothing was changed: --resume none "
            "starts fresh beside them (they are kept), --resume PATH resumes a checkpoint elsewhere",
        )
    return Choice(None, [])


def set_aside(choice: Choice, log: Callable[[str], None]) -> None:
    """Rename the checkpoints ``choose`` passed over (``step_N.bad``) and say so, and which one resumes."""
    for path, why in choice.rejected:
        dest = checkpoint.set_aside(path)
        log(f"warning: checkpoint {path} does not verify ({why}); set aside as {dest} (kept, never pruned)")
    if choice.rejected and choice.path is not None:
        log(f"resuming from {choice.path}, the newest checkpoint that verifies")
