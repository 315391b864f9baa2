"""The trainer's command line: which one is the trainer's (the helper's own rule), a flag's value, a flag
set, a path resolved against a cwd."""

from __future__ import annotations

import posixpath

from console.core.helper_program import identity as helper_identity

TRAINER_MODULE = helper_identity.TRAINER_MODULE
USER_SCRIPT = helper_identity.USER_SCRIPT


def is_trainer_cmdline(cmdline: list[str]) -> bool:
    """``python -m trainer.pipeline ...`` or ``python .../train_dflash_pipeline.py ...``: the helper's
    rule (``helper_program.identity.is_trainer_cmdline``), the one every identity check applies."""
    return helper_identity.is_trainer_cmdline(cmdline)


def flag_value(argv: list[str], name: str) -> str | None:
    """The value of ``--name X`` or ``--name=X`` (the last one wins, as argparse does): the helper's reader."""
    return helper_identity.flag_value(argv, name)


def set_flag(argv: list[str], name: str, value: str) -> list[str]:
    """``argv`` with every ``--name X`` / ``--name=X`` removed and ``--name value`` appended."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        if arg == name:
            skip = i + 1 < len(argv)
            continue
        if arg.startswith(name + "="):
            continue
        out.append(arg)
    return [*out, name, value]


def resolve(path: str, cwd: str | None) -> str:
    if not posixpath.isabs(path) and cwd:
        path = posixpath.join(cwd, path)
    return posixpath.normpath(path)
