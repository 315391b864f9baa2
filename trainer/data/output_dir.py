"""``trainer.prepare``'s ``--output-dir``: a new or empty directory, or with ``--overwrite`` one whose earlier
prepare output is removed first (docs/trainer.md "Preparing data").

prepare owns what it writes: regular files named ``part-NNNNN.jsonl`` in the directory and in its ``heldout/``,
``prepare.json`` (how the data was rendered) and ``heldout/`` itself (removed once empty). ``--overwrite`` removes those and nothing else; it follows no
symbolic link and removes none. Anything left that the trainer (``DATA_DIR/*.jsonl``) or the evaluation
(``heldout/*.jsonl``) would read as data refuses the run before anything is removed, naming it: the new output
would be read mixed with it.
"""

from __future__ import annotations

import os
import re
import stat

from trainer.data.chat import PrepareError

OWNED = re.compile(r"(part-\d{5,}\.jsonl|prepare\.json)\Z")
HELDOUT = "heldout"
SHOWN = 3  # entries named in a refusal


def _is_file(path: str) -> bool:
    return stat.S_ISREG(os.lstat(path).st_mode)


def _owned_in(folder: str) -> tuple[list[str], list[str]]:
    """(prepare's files in ``folder``, the other ``*.jsonl`` entries there); symbolic links are never prepare's."""
    owned, foreign = [], []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if OWNED.match(name) and _is_file(path):
            owned.append(path)
        elif name.endswith(".jsonl"):
            foreign.append(path)
    return owned, foreign


def _names(paths: list[str]) -> str:
    more = f" and {len(paths) - SHOWN} more" if len(paths) > SHOWN else ""
    return ", ".join(repr(p) for p in paths[:SHOWN]) + more


def _plan(out_dir: str) -> tuple[list[str], str | None]:
    """What ``--overwrite`` removes: prepare's files (and whether ``heldout/`` goes too); PrepareError for
    anything that stays and would be read as data."""
    owned, foreign = _owned_in(out_dir)
    held = os.path.join(out_dir, HELDOUT)
    held_dir = None
    if os.path.lexists(held):
        mode = os.lstat(held).st_mode
        if stat.S_ISLNK(mode):
            raise PrepareError(
                f"--output-dir: {held!r} is a symbolic link (not followed, not removed): move it away"
            )
        if stat.S_ISDIR(mode):
            h_owned, h_foreign = _owned_in(held)
            owned += h_owned
            foreign += h_foreign
            held_dir = held
    if foreign:
        raise PrepareError(
            f"--output-dir: {_names(foreign)} not written by prepare (kept): the trainer and the evaluation read "
            "every *.jsonl there; move it away or prepare into a new directory"
        )
    return owned, held_dir


def claim(out_dir: str, overwrite: bool, remove: bool = True) -> list[str]:
    """Make ``out_dir`` ready for prepare's output: the paths removed (``--overwrite``), or PrepareError for
    a used directory without it (nothing removed). ``remove`` False: only the checks, the paths it would remove."""
    if not os.path.lexists(out_dir):
        return []
    if not os.path.isdir(out_dir):
        raise PrepareError(f"--output-dir: {out_dir!r} exists and is not a directory")
    entries = sorted(os.listdir(out_dir))
    if not entries:
        return []
    if not overwrite:
        raise PrepareError(
            f"--output-dir: {out_dir!r} is not empty ({_names(entries)}): prepare into a new directory, or "
            "--overwrite to replace an earlier prepare's output (part-*.jsonl, heldout/)"
        )
    owned, held_dir = _plan(out_dir)
    if not remove:
        return owned
    for path in owned:
        os.unlink(path)
    if held_dir is not None and not os.listdir(held_dir):
        os.rmdir(held_dir)
        owned.append(held_dir + os.sep)
    return owned
