"""The drafter's architecture of a run, from its run.json: ``drafter`` (the settings the trainer resolved,
a resume's from its checkpoint: docs/run-directory.md), else, in a run.json written before the trainer
recorded them, ``argv`` (its command-line flags).

``drafter_arch(run) -> {"arch", "name", "block_size"} | None``: ``arch`` (``dflash`` / ``dflash2``), its
display name (``DFlash 1`` / ``DFlash 2``) and ``block_size``, as the trainer wrote them. The console keeps no
copy of the trainer's defaults: ``LEGACY_BLOCK`` is what the trainers that wrote no ``drafter`` record
(before 2026-12) used for an absent ``--block-size`` (16, or 8 for DFlash 2), a fact about those runs. For
them, an absent ``--arch`` is ``dflash``: a run started before ``--arch`` existed trained DFlash 1. None
without a ``drafter`` record or an argv.
"""

from __future__ import annotations

from console.core.trainer_argv import flag_value

NAMES = {"dflash": "DFlash 1", "dflash2": "DFlash 2"}
LEGACY_BLOCK = {"dflash": 16, "dflash2": 8}  # frozen: runs without a drafter record only


def drafter_arch(run: dict | None) -> dict | None:
    resolved = run.get("drafter") if isinstance(run, dict) else None
    if isinstance(resolved, dict) and resolved.get("arch") in NAMES:  # the trainer's resolved settings
        block = resolved.get("block_size")
        arch = resolved["arch"]
        return {"arch": arch, "name": NAMES[arch], "block_size": block if isinstance(block, int) else None}
    argv = run.get("argv") if isinstance(run, dict) else None
    if not isinstance(argv, list):
        return None
    argv = [str(a) for a in argv]
    arch = flag_value(argv, "--arch") or "dflash"
    block = flag_value(argv, "--block-size")
    try:
        block_size = int(block) if block is not None else LEGACY_BLOCK.get(arch)
    except ValueError:
        block_size = None
    return {"arch": arch, "name": NAMES.get(arch, arch), "block_size": block_size}


def arch_text(info: dict | None) -> str:
    if not info:
        return "-"
    return info["name"] + (f" (block {info['block_size']})" if info.get("block_size") else "")
